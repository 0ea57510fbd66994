package pingback

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Entry is one subscriber in the dead-letter queue (or, while it is being
// served, in the pending journal). It holds no API key.
type Entry struct {
	// ID names the entry in `solveonce dlq`: hex of a hash of account,
	// task and URL.
	ID         string    `json:"id"`
	Account    string    `json:"account"` // account hash, never the key
	Task       string    `json:"task"`
	Method     string    `json:"method,omitempty"` // in.php method of the submission
	URL        string    `json:"url"`
	Code       string    `json:"code,omitempty"` // answer or error code; "" when never learnt
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error,omitempty"`
	Subscribed time.Time `json:"subscribed"`
	Failed     time.Time `json:"failed"` // when it was dead-lettered
}

// Store is the bbolt file of the dead-letter queue, the delivered set (for
// idempotent delivery) and the pending journal (subscribers being served,
// to be dead-lettered if solveonce stops without a graceful shutdown).
type Store struct {
	db   *bolt.DB
	path string
	dead atomic.Int64 // entries in the dead-letter queue
}

var (
	bucketDead      = []byte("dead")
	bucketDelivered = []byte("delivered")
	bucketPending   = []byte("pending")
)

// ErrLocked is returned by OpenStore when another process (a running
// solveonce) holds the file.
var ErrLocked = errors.New("pingback: the dead-letter queue file is in use by another process")

// OpenStore opens (creating it and its directory, mode 0700, when absent)
// the store at path, waiting at most lockWait for another process to let go
// of it.
func OpenStore(path string, lockWait time.Duration) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("pingback: create data directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockWait})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("pingback: open %s: %w", path, err)
	}
	s := &Store{db: db, path: path}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketDead, bucketDelivered, bucketPending} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		s.dead.Store(int64(tx.Bucket(bucketDead).Stats().KeyN))
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("pingback: initialise %s: %w", path, err)
	}
	return s, nil
}

// Close closes the file.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("pingback: close %s: %w", s.path, err)
	}
	return nil
}

// Path returns the file's path.
func (s *Store) Path() string { return s.path }

// Len returns the number of dead letters.
func (s *Store) Len() int64 { return s.dead.Load() }

// subKey names one subscriber: a task of an account and a pingback URL.
func subKey(acct, task, rawURL string) []byte {
	h := sha256.New()
	h.Write([]byte(acct))
	h.Write([]byte{0})
	h.Write([]byte(task))
	h.Write([]byte{0})
	h.Write([]byte(rawURL))
	return h.Sum(nil)[:16]
}

// Delivered reports whether the subscriber k was served and is still
// remembered.
func (s *Store) Delivered(k []byte, now time.Time) (bool, error) {
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketDelivered).Get(k)
		ok = len(v) == 8 && int64(binary.BigEndian.Uint64(v)) > now.Unix()
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("pingback: read delivered set: %w", err)
	}
	return ok, nil
}

// MarkDelivered remembers that subscriber k was served, until until; a
// dead letter or pending record of k is dropped.
func (s *Store) MarkDelivered(k []byte, until time.Time) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(until.Unix()))
	err := s.db.Batch(func(tx *bolt.Tx) error {
		if err := s.deleteDead(tx, k); err != nil {
			return err
		}
		if err := tx.Bucket(bucketPending).Delete(k); err != nil {
			return err
		}
		return tx.Bucket(bucketDelivered).Put(k, v[:])
	})
	if err != nil {
		return fmt.Errorf("pingback: write delivered set: %w", err)
	}
	return nil
}

// Sweep forgets deliveries remembered until before now and returns how many.
func (s *Store) Sweep(now time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketDelivered)
		var expired [][]byte
		err := b.ForEach(func(k, v []byte) error {
			if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) <= now.Unix() {
				expired = append(expired, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range expired {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(expired)
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("pingback: sweep delivered set: %w", err)
	}
	return n, nil
}

// Bury adds entries to the dead-letter queue and drops their pending
// records. An entry already there is replaced, keeping a known answer and
// adding up the attempts.
func (s *Store) Bury(entries ...Entry) error {
	if len(entries) == 0 {
		return nil
	}
	err := s.db.Batch(func(tx *bolt.Tx) error {
		dead := tx.Bucket(bucketDead)
		added := 0
		for _, e := range entries {
			k, err := hex.DecodeString(e.ID)
			if err != nil || len(k) != 16 {
				k = subKey(e.Account, e.Task, e.URL)
				e.ID = hex.EncodeToString(k)
			}
			if old := dead.Get(k); old != nil {
				var o Entry
				if json.Unmarshal(old, &o) == nil {
					if e.Code == "" {
						e.Code = o.Code
					}
					if e.Attempts < o.Attempts {
						e.Attempts += o.Attempts
					}
				}
			} else {
				added++
			}
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			if err := dead.Put(k, b); err != nil {
				return err
			}
			if err := tx.Bucket(bucketPending).Delete(k); err != nil {
				return err
			}
		}
		tx.OnCommit(func() { s.dead.Add(int64(added)) })
		return nil
	})
	if err != nil {
		return fmt.Errorf("pingback: write dead-letter queue: %w", err)
	}
	return nil
}

// deleteDead removes k from the dead-letter queue within tx.
func (s *Store) deleteDead(tx *bolt.Tx, k []byte) error {
	b := tx.Bucket(bucketDead)
	if b.Get(k) == nil {
		return nil
	}
	if err := b.Delete(k); err != nil {
		return err
	}
	tx.OnCommit(func() { s.dead.Add(-1) })
	return nil
}

// DeadLetters returns the dead-letter queue, oldest first.
func (s *Store) DeadLetters() ([]Entry, error) {
	var out []Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDead).ForEach(func(k, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				e = Entry{LastError: "unreadable entry: " + err.Error()}
			}
			e.ID = hex.EncodeToString(k)
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("pingback: read dead-letter queue: %w", err)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := a.Failed.Compare(b.Failed); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Remove drops the dead letters with these IDs and returns how many there
// were.
func (s *Store) Remove(ids ...string) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		for _, id := range ids {
			k, err := hex.DecodeString(id)
			if err != nil {
				continue
			}
			if tx.Bucket(bucketDead).Get(k) != nil {
				n++
			}
			if err := s.deleteDead(tx, k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pingback: remove dead letters: %w", err)
	}
	return n, nil
}

// update rewrites a dead letter that is still there (after a failed
// replay).
func (s *Store) update(e Entry) error {
	k, err := hex.DecodeString(e.ID)
	if err != nil {
		return fmt.Errorf("pingback: bad entry ID %q: %w", e.ID, err)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("pingback: encode entry: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketDead).Get(k) == nil {
			return nil
		}
		return tx.Bucket(bucketDead).Put(k, b)
	})
	if err != nil {
		return fmt.Errorf("pingback: update dead letter: %w", err)
	}
	return nil
}

// jop is one journal operation: record a subscriber as pending, forget it,
// or dead-letter it.
type jop struct {
	kind  uint8 // jopPending, jopDone, jopBury
	entry Entry
}

const (
	jopPending uint8 = iota
	jopDone
	jopBury
)

// apply writes journal operations in order, in one transaction.
func (s *Store) apply(ops []jop) error {
	if len(ops) == 0 {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		pending, dead := tx.Bucket(bucketPending), tx.Bucket(bucketDead)
		added := 0
		for _, op := range ops {
			k := subKey(op.entry.Account, op.entry.Task, op.entry.URL)
			switch op.kind {
			case jopPending:
				b, err := json.Marshal(op.entry)
				if err != nil {
					return err
				}
				if err := pending.Put(k, b); err != nil {
					return err
				}
			case jopDone:
				if err := pending.Delete(k); err != nil {
					return err
				}
			case jopBury:
				if dead.Get(k) == nil {
					added++
				}
				e := op.entry
				e.ID = hex.EncodeToString(k)
				b, err := json.Marshal(e)
				if err != nil {
					return err
				}
				if err := dead.Put(k, b); err != nil {
					return err
				}
				if err := pending.Delete(k); err != nil {
					return err
				}
			}
		}
		tx.OnCommit(func() { s.dead.Add(int64(added)) })
		return nil
	})
	if err != nil {
		return fmt.Errorf("pingback: write journal: %w", err)
	}
	return nil
}

// recoverPending dead-letters the subscribers a previous process was
// serving when it stopped without a graceful shutdown, and returns how
// many. Subscribers since delivered or already dead-lettered are dropped
// from the journal.
func (s *Store) recoverPending(now time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		pending, dead, delivered := tx.Bucket(bucketPending), tx.Bucket(bucketDead), tx.Bucket(bucketDelivered)
		var keys [][]byte
		err := pending.ForEach(func(k, v []byte) error {
			keys = append(keys, bytes.Clone(k))
			if dead.Get(k) != nil || delivered.Get(k) != nil {
				return nil
			}
			var e Entry
			if json.Unmarshal(v, &e) != nil {
				return nil
			}
			e.ID = hex.EncodeToString(k)
			e.Failed = now
			if e.LastError == "" {
				e.LastError = "solveonce stopped without a graceful shutdown before delivering"
			}
			b, err := json.Marshal(e)
			if err != nil {
				return err
			}
			n++
			return dead.Put(k, b)
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := pending.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pingback: recover pending journal: %w", err)
	}
	s.dead.Add(int64(n))
	return n, nil
}
