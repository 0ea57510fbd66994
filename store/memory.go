package store

import (
	"container/heap"
	"context"
	"fmt"
	"sync"
	"time"
)

// DefaultMaxEntries is the MaxEntries a Memory uses when its config leaves it
// zero (or negative).
const DefaultMaxEntries = 1_000_000

// sweepBatch is how many expired entries one write removes at most before it
// proceeds. Every write creates at most one entry and removes up to
// sweepBatch expired ones, so expired entries cannot pile up faster than the
// writes that made them, and no single write pays for a mass expiry.
const sweepBatch = 32

// maxTTL caps a TTL so that now+ttl cannot overflow time.Time arithmetic.
const maxTTL = 100 * 365 * 24 * time.Hour

// MemoryConfig configures a Memory index.
type MemoryConfig struct {
	// MaxEntries bounds the number of keys held. When a write would add a
	// key beyond it, the entry nearest to expiry is evicted (a write never
	// fails for lack of room). Zero or negative means DefaultMaxEntries.
	MaxEntries int `toml:"max_entries"`
	// Now is the clock used for expiry; nil means time.Now. Tests inject a
	// fake clock here.
	Now func() time.Time `toml:"-"`
}

// Memory is an in-process Index: a map under one mutex with per-entry
// expiry. It is exact for a single process and is what solveonce uses when no
// shared store is configured. Values are copied in and out, so callers can
// never modify stored bytes. Expired entries are invisible at once and are
// removed lazily on access and by a bounded sweep on every write.
//
// Create one with NewMemory; the zero value is not usable.
type Memory struct {
	max int
	now func() time.Time

	mu   sync.Mutex // guards m, exp, subs
	m    map[string]*memEntry
	exp  expiryHeap                      // every entry of m, nearest expiry first
	subs map[string]map[*memSub]struct{} // key → its live subscriptions
}

var _ Index = (*Memory)(nil)

// memEntry is one stored key.
type memEntry struct {
	key string
	val []byte    // owned by the Memory; never handed out
	exp time.Time // the entry is expired once now is not before exp
	idx int       // position in Memory.exp
}

// memSub is one Subscribe call.
type memSub struct {
	ch chan struct{}
}

// NewMemory returns an empty Memory configured by cfg.
func NewMemory(cfg MemoryConfig) *Memory {
	limit := cfg.MaxEntries
	if limit <= 0 {
		limit = DefaultMaxEntries
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Memory{
		max:  limit,
		now:  now,
		m:    make(map[string]*memEntry),
		subs: make(map[string]map[*memSub]struct{}),
	}
}

// Get returns a copy of the value stored under key; ok is false when the key
// is absent or expired.
func (m *Memory) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("store: get %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.liveLocked(key, m.now())
	if e == nil {
		return nil, false, nil
	}
	return clone(e.val), true, nil
}

// getTTL returns a copy of the value stored under key and the time it has
// left; ok is false when the key is absent or expired.
func (m *Memory) getTTL(key string) (val []byte, ttl time.Duration, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	e := m.liveLocked(key, now)
	if e == nil {
		return nil, 0, false
	}
	return clone(e.val), e.exp.Sub(now), true
}

// Update atomically applies fn to key. fn runs exactly once, with the mutex
// held, on a private copy of the current value; it must not block or call
// back into m. After a Put or a Delete of a present key, subscribers of key
// are notified.
func (m *Memory) Update(ctx context.Context, key string, fn UpdateFunc) ([]byte, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("store: update %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	now := m.now()
	e := m.liveLocked(key, now)
	var cur []byte
	if e != nil {
		cur = clone(e.val)
	}
	next, ttl, op := fn(cur, e != nil)

	switch op {
	case Keep:
		if e == nil {
			return nil, false, nil
		}
		return clone(e.val), true, nil
	case Delete:
		if e == nil {
			return nil, false, nil
		}
		m.removeLocked(e)
		m.notifyLocked(key)
		m.sweepLocked(now, sweepBatch)
		return nil, false, nil
	case Put:
		if ttl <= 0 {
			return nil, false, fmt.Errorf("store: update %q: put with ttl %v: %w", key, ttl, ErrInvalidUpdate)
		}
		m.putLocked(key, clone(next), now.Add(min(ttl, maxTTL)), now)
		m.notifyLocked(key)
		// next is the caller's own slice (fn made it); the stored bytes are
		// a separate copy, so handing next back leaks nothing.
		return next, true, nil
	default:
		return nil, false, fmt.Errorf("store: update %q: %v: %w", key, op, ErrInvalidUpdate)
	}
}

// Delete removes key and notifies its subscribers. Deleting an absent key is
// not an error.
func (m *Memory) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: delete %q: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.m[key]; e != nil {
		m.removeLocked(e)
	}
	m.notifyLocked(key)
	m.sweepLocked(m.now(), sweepBatch)
	return nil
}

// Subscribe returns a channel (buffer 1) that receives a value after key is
// changed by Update or Delete, or evicted. The subscription ends when cancel
// is called or ctx is done, whichever comes first; the channel is never
// closed.
func (m *Memory) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, func() {}, fmt.Errorf("store: subscribe %q: %w", key, err)
	}
	s := &memSub{ch: make(chan struct{}, 1)}
	m.mu.Lock()
	set := m.subs[key]
	if set == nil {
		set = make(map[*memSub]struct{})
		m.subs[key] = set
	}
	set[s] = struct{}{}
	m.mu.Unlock()

	remove := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if set := m.subs[key]; set != nil {
			delete(set, s)
			if len(set) == 0 {
				delete(m.subs, key)
			}
		}
	}
	// AfterFunc starts no goroutine until ctx is done, and stop unregisters
	// it, so neither path leaks.
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

// Ping reports that the index is reachable; it always is.
func (m *Memory) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	return nil
}

// Len returns the number of live (unexpired) entries, for metrics. It
// removes the expired entries it finds.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sweepLocked(m.now(), -1)
	return len(m.m)
}

// liveLocked returns key's entry, or nil if it is absent or expired at now;
// an expired entry is removed on the way.
func (m *Memory) liveLocked(key string, now time.Time) *memEntry {
	e := m.m[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.exp) {
		m.removeLocked(e)
		return nil
	}
	return e
}

// putLocked stores val (already a private copy) under key until exp, making
// room first if key is new and m is full.
func (m *Memory) putLocked(key string, val []byte, exp, now time.Time) {
	if e := m.m[key]; e != nil {
		e.val = val
		e.exp = exp
		heap.Fix(&m.exp, e.idx)
		m.sweepLocked(now, sweepBatch)
		return
	}
	m.sweepLocked(now, sweepBatch)
	for len(m.m) >= m.max && len(m.exp) > 0 {
		// After the sweep the heap's head is the entry nearest to expiry
		// (or an expired one the bounded sweep did not reach): evict it.
		victim := m.exp[0]
		m.removeLocked(victim)
		m.notifyLocked(victim.key)
	}
	e := &memEntry{key: key, val: val, exp: exp}
	m.m[key] = e
	heap.Push(&m.exp, e)
}

// sweepLocked removes up to limit expired entries (all of them when limit
// is negative), nearest expiry first.
func (m *Memory) sweepLocked(now time.Time, limit int) {
	for n := 0; len(m.exp) > 0 && (limit < 0 || n < limit); n++ {
		e := m.exp[0]
		if now.Before(e.exp) {
			return
		}
		m.removeLocked(e)
	}
}

// removeLocked drops e from the map and the expiry heap.
func (m *Memory) removeLocked(e *memEntry) {
	heap.Remove(&m.exp, e.idx)
	delete(m.m, e.key)
}

// notifyLocked wakes every subscriber of key without blocking: a subscriber
// whose buffer is full has a wakeup pending already.
func (m *Memory) notifyLocked(key string) {
	for s := range m.subs[key] {
		select {
		case s.ch <- struct{}{}:
		default:
		}
	}
}

// clone returns a copy of b that shares no memory with it (nil for nil).
func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// expiryHeap orders entries by expiry, nearest first, for container/heap.
type expiryHeap []*memEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].exp.Before(h[j].exp) }

func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}

func (h *expiryHeap) Push(x any) {
	e := x.(*memEntry)
	e.idx = len(*h)
	*h = append(*h, e)
}

func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.idx = -1
	*h = old[:n-1]
	return e
}
