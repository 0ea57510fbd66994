package intercept

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/store"
)

// decideStored runs decide atomically against the index.
func (l *Layer) decideStored(ctx context.Context, key string, pol Policy, payload string, fresh bool) (decision, error) {
	var d decision
	me := l.self + "-" + nonce()
	now := l.now()
	_, _, err := l.index.Update(ctx, key, func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		var e entry
		if ok && json.Unmarshal(cur, &e) != nil {
			ok = false // a corrupt entry is treated as absent and overwritten
		}
		var next entry
		var write bool
		d, next, write = decide(e, ok, pol, payload, me, now, fresh)
		if !write {
			return nil, 0, store.Keep
		}
		b, err := json.Marshal(next)
		if err != nil {
			return nil, 0, store.Keep
		}
		return b, l.entryTTL(next, now), store.Put
	})
	if err != nil {
		return decision{}, fmt.Errorf("%w: decide %s: %w", errStore, key, err)
	}
	return d, nil
}

// entryTTL is how long an entry stays: a claim for its lease, a task until
// its window closes.
func (l *Layer) entryTTL(e entry, now time.Time) time.Duration {
	if e.Pending {
		return l.cfg.ClaimTTL
	}
	ttl := time.UnixMilli(e.Created + e.Window).Sub(now)
	if ttl < time.Millisecond {
		ttl = time.Millisecond
	}
	return ttl
}

// updateEntry applies fn to the entry under key, keeping its TTL policy:
// pending entries get a fresh lease, task entries keep their window. It
// reports whether fn changed the entry.
func (l *Layer) updateEntry(ctx context.Context, key string, fn func(entry) (entry, bool)) bool {
	changed := false
	now := l.now()
	_, _, err := l.index.Update(ctx, key, func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		changed = false
		var e entry
		if !ok || json.Unmarshal(cur, &e) != nil {
			return nil, 0, store.Keep
		}
		next, write := fn(e)
		if !write {
			return nil, 0, store.Keep
		}
		b, err := json.Marshal(next)
		if err != nil {
			return nil, 0, store.Keep
		}
		changed = true
		return b, l.entryTTL(next, now), store.Put
	})
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		return false
	}
	return changed
}

// getEntry reads the entry under key.
func (l *Layer) getEntry(ctx context.Context, key string) (entry, bool, error) {
	b, ok, err := l.index.Get(ctx, key)
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		return entry{}, false, fmt.Errorf("%w: get: %w", errStore, err)
	}
	var e entry
	if !ok || json.Unmarshal(b, &e) != nil {
		return entry{}, false, nil
	}
	return e, true, nil
}

// taskRecord links a task ID back to its index entry.
type taskRecord struct {
	Key       string        `json:"k"`
	Orphans   bool          `json:"o,omitempty"`
	AnswerTTL time.Duration `json:"a,omitempty"`
}

// task is a taskRecord this replica has loaded, with local poll state.
type task struct {
	taskRecord
	known   bool         // false: no record (a task solveonce did not index)
	expires int64        // unix ms after which the local copy is dropped
	touched atomic.Int64 // unix ms of the last touch written to the index
}

// maxLocalTasks bounds the local task map.
const maxLocalTasks = 200_000

func taskKey(acct, id string) string { return "t:" + acct + ":" + id }

// rememberTask stores the record for a task and keeps it locally.
func (l *Layer) rememberTask(ctx context.Context, acct, id string, rec taskRecord, ttl time.Duration) {
	b, err := json.Marshal(rec)
	if err == nil {
		_, _, err = l.index.Update(ctx, taskKey(acct, id), func([]byte, bool) ([]byte, time.Duration, store.Op) {
			return b, ttl, store.Put
		})
	}
	if err != nil {
		l.Stats.StoreErrors.Add(1)
	}
	l.keepTask(acct+":"+id, &task{taskRecord: rec, known: true}, ttl)
}

func (l *Layer) keepTask(k string, t *task, ttl time.Duration) {
	now := l.now().UnixMilli()
	t.expires = now + ttl.Milliseconds()
	if _, loaded := l.tasks.Swap(k, t); !loaded {
		if l.ntasks.Add(1) > maxLocalTasks {
			l.pruneTasks(now)
		}
	}
}

// pruneTasks drops expired local tasks, and every other one of the rest if
// that is not enough.
func (l *Layer) pruneTasks(now int64) {
	n := 0
	l.tasks.Range(func(k, v any) bool {
		if v.(*task).expires <= now || n%2 == 0 {
			l.tasks.Delete(k)
			l.ntasks.Add(-1)
		}
		n++
		return true
	})
}

// lookupTask returns what is known about a task, loading it from the index
// when this replica has not seen it.
func (l *Layer) lookupTask(ctx context.Context, acct, id string) *task {
	k := acct + ":" + id
	now := l.now().UnixMilli()
	if v, ok := l.tasks.Load(k); ok && v.(*task).expires > now {
		return v.(*task)
	}
	t := &task{}
	b, ok, err := l.index.Get(ctx, taskKey(acct, id))
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		return t // not cached: ask again next time
	}
	if ok && json.Unmarshal(b, &t.taskRecord) == nil {
		t.known = true
		l.keepTask(k, t, 10*time.Minute)
		return t
	}
	l.keepTask(k, t, 5*time.Second)
	return t
}

// nonce returns a short random string.
func nonce() string {
	var b [6]byte
	randRead(b[:])
	return fmt.Sprintf("%x", b)
}
