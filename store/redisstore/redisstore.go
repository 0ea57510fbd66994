// Package redisstore implements store.Index on Redis, so that several
// solveonce processes ("replicas") share one exact submission index.
//
// # Keys
//
// A caller's key k is stored under prefix + "{" + k + "}". The braces make k
// a Redis Cluster hash tag: any future multi-key operation on the records of
// one fingerprint lands in one slot. Keys are opaque to this package and may
// contain anything, braces included; a key that contains '{' or '}' would
// break the hash tag (and could collide with another key), so such a key is
// stored instead as prefix + "{" + base64url(k) + "}:b64" (RFC 4648 URL
// alphabet, no padding). The two forms cannot collide: a plain key's Redis
// key ends at its first '}', an encoded one continues after it. The prefix
// itself must not contain braces.
//
// # Updates
//
// Update first reads the key with a plain GET and runs the pure UpdateFunc:
// if it keeps the value, that is the whole update (one round trip; most
// updates of a dedup index only read). Otherwise it is an optimistic
// transaction: WATCH the key, GET it, run the UpdateFunc again, then
// MULTI / SET PX (or DEL) / PUBLISH / EXEC. If another writer touched the
// key in between, EXEC aborts and the whole round is retried after a short
// jittered backoff, up to a bound; past it, or when ctx ends after a
// conflict, Update returns store.ErrConflict. A Keep writes nothing and
// costs no MULTI.
//
// For the submission index this is SET NX PX with a compare-and-delete
// release, generalised: a claim is an UpdateFunc that puts a pending
// marker (with the claim TTL as PX) only when the key is absent, and a
// release or commit is one that writes only when the stored marker still
// names the caller. WATCH makes each check-and-write atomic.
//
// # Notifications
//
// Every write also publishes the caller's key on the channel
// prefix + "changes", inside the same MULTI, so a change and its
// notification are one atomic step. Each Index keeps a single pub/sub
// connection, opened by the first Subscribe, and fans messages out to local
// per-key channels. If that connection drops, go-redis reconnects and
// resubscribes; as writes made during the gap were not seen, every local
// subscriber is then woken once to re-read (the store.Index contract allows
// spurious wakeups). Close ends the pub/sub connection.
package redisstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/store"
)

// DefaultPrefix is the key prefix New uses for an empty prefix.
const DefaultPrefix = "solveonce:"

// MaxAttempts bounds the optimistic transaction rounds of one Update before
// it gives up with store.ErrConflict.
const MaxAttempts = 64

// maxTTL caps a TTL (100 years) so that Redis's now+ttl cannot overflow.
const maxTTL = 100 * 365 * 24 * time.Hour

// encodedSuffix follows the braces of a key stored base64url-encoded.
const encodedSuffix = ":b64"

const (
	// backoffBase is the first retry's maximum backoff; it doubles per
	// attempt up to backoffBase << backoffMaxShift (6.4 ms).
	backoffBase     = 50 * time.Microsecond
	backoffMaxShift = 7
	// confirmTimeout bounds the wait for Redis to confirm the SUBSCRIBE
	// that the first Subscribe starts (a shorter ctx deadline wins).
	confirmTimeout = 10 * time.Second
	// pubsubBuffer is the go-redis channel size between the pub/sub
	// connection and the dispatching goroutine.
	pubsubBuffer = 1024
)

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("redisstore: index closed")

// Index is a store.Index on Redis. It is safe for concurrent use, and any
// number of Index values, in any number of processes, may share one Redis
// and prefix. Create one with New and Close it when done.
type Index struct {
	rdb     redis.UniversalClient
	prefix  string
	channel string

	// start serialises opening the pub/sub connection; a buffered
	// channel rather than a mutex so that waiting honours ctx.
	start chan struct{}

	mu     sync.Mutex // guards subs, ps, done, closed
	subs   map[string]map[*subscriber]struct{}
	ps     *redis.PubSub // nil until the first Subscribe, and after Close
	done   chan struct{} // closed when the dispatch goroutine for ps ends
	closed bool
}

var _ store.Index = (*Index)(nil)

// subscriber is one Subscribe call.
type subscriber struct {
	ch chan struct{}
}

// New returns an Index storing its keys in rdb under prefix ("" means
// DefaultPrefix). rdb stays the caller's: Close does not close it. New
// panics if prefix contains '{' or '}', which would break the key scheme.
func New(rdb redis.UniversalClient, prefix string) *Index {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		panic(fmt.Sprintf("redisstore: prefix %q contains a brace", prefix))
	}
	return &Index{
		rdb:     rdb,
		prefix:  prefix,
		channel: prefix + "changes",
		start:   make(chan struct{}, 1),
		subs:    make(map[string]map[*subscriber]struct{}),
	}
}

// RedisKey returns the Redis key that holds key (see the package doc).
func (i *Index) RedisKey(key string) string {
	if strings.ContainsAny(key, "{}") {
		return i.prefix + "{" + base64.RawURLEncoding.EncodeToString([]byte(key)) + "}" + encodedSuffix
	}
	return i.prefix + "{" + key + "}"
}

// Channel returns the pub/sub channel on which changes are published.
func (i *Index) Channel() string { return i.channel }

// Get returns the value stored under key.
func (i *Index) Get(ctx context.Context, key string) ([]byte, bool, error) {
	val, err := i.rdb.Get(ctx, i.RedisKey(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("redisstore: get %q: %w", key, err)
	}
	return val, true, nil
}

// Update atomically applies fn to key with an optimistic transaction (see
// the package doc). fn may run several times.
func (i *Index) Update(ctx context.Context, key string, fn store.UpdateFunc) ([]byte, bool, error) {
	rkey := i.RedisKey(key)
	if val, ok, done, err := i.readOnly(ctx, rkey, fn); err != nil {
		return nil, false, fmt.Errorf("redisstore: update %q: %w", key, err)
	} else if done {
		return val, ok, nil
	}
	for attempt := range MaxAttempts {
		if attempt > 0 {
			if err := backoff(ctx, attempt); err != nil {
				return nil, false, contended(key, attempt, err)
			}
		}
		val, ok, err := i.updateOnce(ctx, key, rkey, fn)
		if errors.Is(err, redis.TxFailedErr) {
			continue
		}
		if err != nil {
			if attempt > 0 && ctx.Err() != nil {
				return nil, false, contended(key, attempt, err)
			}
			return nil, false, fmt.Errorf("redisstore: update %q: %w", key, err)
		}
		return val, ok, nil
	}
	return nil, false, fmt.Errorf("redisstore: update %q: %d attempts: %w", key, MaxAttempts, store.ErrConflict)
}

// contended is the error of an Update whose ctx ended after conflicts:
// Redis was answering, other writers were winning. It wraps both
// store.ErrConflict and err (the context's), so a caller can tell
// contention from an unreachable server.
func contended(key string, conflicts int, err error) error {
	return fmt.Errorf("redisstore: update %q: %w after %d conflicts: %w", key, store.ErrConflict, conflicts, err)
}

// readOnly is Update's fast path: a plain GET and fn. When fn keeps the
// value, the update is complete (consistent as of the GET, as a Keep
// writes nothing) in one round trip instead of WATCH/GET/UNWATCH's three;
// done is false when fn wants to write, which then takes the transaction.
// Most updates of a dedup index only read: every replayed submission.
func (i *Index) readOnly(ctx context.Context, rkey string, fn store.UpdateFunc) (val []byte, ok, done bool, err error) {
	cur, err := i.rdb.Get(ctx, rkey).Bytes()
	present := true
	if errors.Is(err, redis.Nil) {
		cur, present = nil, false
	} else if err != nil {
		return nil, false, false, err
	}
	// fn gets its own copy: it must not see a mutation of the returned
	// slice, nor may its mutations reach the caller.
	if _, _, op := fn(bytes.Clone(cur), present); op != store.Keep {
		return nil, false, false, nil
	}
	return cur, present, true, nil
}

// updateOnce is one WATCH/GET/fn/MULTI/EXEC round. It returns
// redis.TxFailedErr when another writer got in between.
func (i *Index) updateOnce(ctx context.Context, key, rkey string, fn store.UpdateFunc) (val []byte, ok bool, err error) {
	err = i.rdb.Watch(ctx, func(tx *redis.Tx) error {
		cur, err := tx.Get(ctx, rkey).Bytes()
		present := true
		if errors.Is(err, redis.Nil) {
			cur, present = nil, false
		} else if err != nil {
			return err
		}
		next, ttl, op := fn(cur, present)
		switch op {
		case store.Keep:
			// Consistent as of the GET, which saw the key as it was.
			val, ok = cur, present
			return nil
		case store.Delete:
			val, ok = nil, false
			if !present {
				return nil // nothing to delete: as of the GET it was absent
			}
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, rkey)
				p.Publish(ctx, i.channel, key)
				return nil
			})
			return err
		case store.Put:
			if ttl <= 0 {
				return fmt.Errorf("put with ttl %v: %w", ttl, store.ErrInvalidUpdate)
			}
			// Redis keeps milliseconds: round up, never shorten. Cap it
			// so that Redis's now+ttl cannot overflow.
			ttl = min(ttl, maxTTL)
			ttl = (ttl + time.Millisecond - 1) / time.Millisecond * time.Millisecond
			_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, rkey, next, ttl)
				p.Publish(ctx, i.channel, key)
				return nil
			})
			if next == nil {
				next = []byte{} // what a Get will return
			}
			val, ok = next, true
			return err
		default:
			return fmt.Errorf("%v: %w", op, store.ErrInvalidUpdate)
		}
	}, rkey)
	if err != nil {
		return nil, false, err
	}
	return val, ok, nil
}

// backoff sleeps a random duration below backoffBase << attempt (capped),
// or until ctx ends.
func backoff(ctx context.Context, attempt int) error {
	limit := backoffBase << min(attempt, backoffMaxShift)
	timer := time.NewTimer(rand.N(limit) + 1)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Delete removes key and notifies its subscribers everywhere. Deleting an
// absent key is not an error (its subscribers are still woken).
func (i *Index) Delete(ctx context.Context, key string) error {
	rkey := i.RedisKey(key)
	_, err := i.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, rkey)
		p.Publish(ctx, i.channel, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("redisstore: delete %q: %w", key, err)
	}
	return nil
}

// Subscribe returns a channel (buffer 1) that receives a value after key is
// changed by any Index sharing this Redis and prefix, and once after the
// pub/sub connection recovers from an outage. The first Subscribe on i opens
// the pub/sub connection and returns only once Redis has confirmed it, so a
// change made after Subscribe returns is never missed while the connection
// is up. The subscription ends when cancel is called or ctx is done; the
// channel is never closed.
func (i *Index) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	noop := func() {}
	if err := ctx.Err(); err != nil {
		return nil, noop, fmt.Errorf("redisstore: subscribe %q: %w", key, err)
	}
	if err := i.ensureStarted(ctx); err != nil {
		return nil, noop, fmt.Errorf("redisstore: subscribe %q: %w", key, err)
	}

	s := &subscriber{ch: make(chan struct{}, 1)}
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil, noop, fmt.Errorf("redisstore: subscribe %q: %w", key, ErrClosed)
	}
	set := i.subs[key]
	if set == nil {
		set = make(map[*subscriber]struct{})
		i.subs[key] = set
	}
	set[s] = struct{}{}
	i.mu.Unlock()

	remove := func() {
		i.mu.Lock()
		defer i.mu.Unlock()
		if set := i.subs[key]; set != nil {
			delete(set, s)
			if len(set) == 0 {
				delete(i.subs, key)
			}
		}
	}
	// AfterFunc starts no goroutine until ctx is done, and stop
	// unregisters it, so neither path leaks.
	stop := context.AfterFunc(ctx, remove)
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			stop()
			remove()
		})
	}
	return s.ch, cancel, nil
}

// ensureStarted opens the shared pub/sub connection unless it is open, and
// waits for Redis to confirm the subscription.
func (i *Index) ensureStarted(ctx context.Context) error {
	select {
	case i.start <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-i.start }()

	i.mu.Lock()
	closed, running := i.closed, i.ps != nil
	i.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if running {
		return nil
	}

	ps := i.rdb.Subscribe(ctx, i.channel)
	// A blocked read honours only deadlines; closing ps honours cancel.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	msg, err := ps.ReceiveTimeout(ctx, confirmTimeout)
	if !stop() {
		_ = ps.Close()
		return fmt.Errorf("subscribe %q: %w", i.channel, context.Cause(ctx))
	}
	if err != nil {
		_ = ps.Close()
		return fmt.Errorf("subscribe %q: %w", i.channel, err)
	}
	if sub, ok := msg.(*redis.Subscription); !ok || sub.Kind != "subscribe" {
		_ = ps.Close()
		return fmt.Errorf("subscribe %q: unexpected first reply %v", i.channel, msg)
	}

	// From here on go-redis reads the connection, pings it every few
	// seconds, and reconnects and resubscribes when it breaks; each
	// resubscription shows up as a *redis.Subscription.
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(pubsubBuffer))
	done := make(chan struct{})
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		_ = ps.Close()
		return ErrClosed
	}
	i.ps, i.done = ps, done
	i.mu.Unlock()
	go i.dispatch(ch, done)
	return nil
}

// dispatch fans pub/sub messages out to local subscribers until ch is
// closed (by ps.Close in Close), then closes done.
func (i *Index) dispatch(ch <-chan any, done chan<- struct{}) {
	defer close(done)
	for msg := range ch {
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel == i.channel {
				i.notify(m.Payload)
			}
		case *redis.Subscription:
			// The first confirmation was consumed by ensureStarted;
			// another one means go-redis reconnected. Writes made
			// while it was away were not seen: wake everyone.
			if m.Kind == "subscribe" {
				i.notifyAll()
			}
		}
	}
}

// notify wakes key's subscribers without blocking.
func (i *Index) notify(key string) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for s := range i.subs[key] {
		wake(s)
	}
}

// notifyAll wakes every subscriber without blocking.
func (i *Index) notifyAll() {
	i.mu.Lock()
	defer i.mu.Unlock()
	for _, set := range i.subs {
		for s := range set {
			wake(s)
		}
	}
}

// wake delivers one wakeup unless one is pending already.
func wake(s *subscriber) {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// Ping reports whether Redis answers.
func (i *Index) Ping(ctx context.Context) error {
	if err := i.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// Close stops notifications: it wakes every subscriber one last time, drops
// all subscriptions, closes the pub/sub connection and waits for its
// goroutine to end. Later Subscribe calls fail with ErrClosed; Get, Update,
// Delete and Ping keep working, as the client stays open (it is the
// caller's). Close is safe to call more than once.
func (i *Index) Close() error {
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil
	}
	i.closed = true
	ps, done := i.ps, i.done
	i.ps, i.done = nil, nil
	for _, set := range i.subs {
		for s := range set {
			wake(s)
		}
	}
	i.subs = make(map[string]map[*subscriber]struct{})
	i.mu.Unlock()

	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	if err != nil {
		return fmt.Errorf("redisstore: close: %w", err)
	}
	return nil
}
