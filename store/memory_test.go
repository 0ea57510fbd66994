package store_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Index {
		return store.NewMemory(store.MemoryConfig{})
	})
}

// fakeClock is a settable clock for MemoryConfig.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func putFn(val string, ttl time.Duration) store.UpdateFunc {
	return func([]byte, bool) ([]byte, time.Duration, store.Op) { return []byte(val), ttl, store.Put }
}

func mustPut(t testing.TB, m *store.Memory, key, val string, ttl time.Duration) {
	t.Helper()
	if _, _, err := m.Update(context.Background(), key, putFn(val, ttl)); err != nil {
		t.Fatalf("Update(%q): %v", key, err)
	}
}

func present(t testing.TB, m *store.Memory, key string) bool {
	t.Helper()
	_, ok, err := m.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return ok
}

func TestMemoryDefaults(t *testing.T) {
	m := store.NewMemory(store.MemoryConfig{MaxEntries: -5})
	mustPut(t, m, "k", "v", time.Minute)
	if !present(t, m, "k") || m.Len() != 1 {
		t.Fatalf("Memory with defaults lost a write")
	}
}

func TestMemoryEvictsNearestExpiry(t *testing.T) {
	clock := newFakeClock()
	m := store.NewMemory(store.MemoryConfig{MaxEntries: 3, Now: clock.Now})
	mustPut(t, m, "a", "v", 10*time.Second)
	mustPut(t, m, "b", "v", 5*time.Second) // nearest expiry
	mustPut(t, m, "c", "v", 20*time.Second)

	evicted, cancel, err := m.Subscribe(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()

	// Rewriting a present key when full evicts nothing.
	mustPut(t, m, "a", "v2", 10*time.Second)
	if !present(t, m, "b") {
		t.Fatalf("rewrite of a present key evicted another")
	}

	mustPut(t, m, "d", "v", 30*time.Second)
	if present(t, m, "b") {
		t.Fatalf("b (nearest to expiry) survived eviction")
	}
	for _, k := range []string{"a", "c", "d"} {
		if !present(t, m, k) {
			t.Fatalf("%s evicted; only b should have been", k)
		}
	}
	select {
	case <-evicted:
	default:
		t.Fatalf("subscriber of the evicted key was not woken")
	}

	// Shortening a TTL moves that entry to the front of the line.
	mustPut(t, m, "c", "v", time.Second)
	mustPut(t, m, "e", "v", time.Minute)
	if present(t, m, "c") {
		t.Fatalf("c (re-put with the nearest expiry) survived eviction")
	}

	// However many writes, the bound holds and every write succeeds.
	for i := range 200 {
		mustPut(t, m, "k"+strconv.Itoa(i), "v", time.Duration(1+i%7)*time.Second)
		if n := m.Stored(); n > 3 {
			t.Fatalf("after write %d: %d entries stored, max 3", i, n)
		}
	}
	if n := m.Len(); n != 3 {
		t.Fatalf("Len = %d, want 3", n)
	}
}

func TestMemoryEvictsExpiredFirst(t *testing.T) {
	clock := newFakeClock()
	m := store.NewMemory(store.MemoryConfig{MaxEntries: 2, Now: clock.Now})
	mustPut(t, m, "long", "v", time.Hour)
	mustPut(t, m, "short", "v", time.Second)
	clock.Advance(2 * time.Second)
	mustPut(t, m, "new", "v", time.Minute)
	if !present(t, m, "long") || !present(t, m, "new") {
		t.Fatalf("a live entry was evicted while an expired one was there")
	}
}

func TestMemoryLazyExpiry(t *testing.T) {
	clock := newFakeClock()
	m := store.NewMemory(store.MemoryConfig{Now: clock.Now})
	mustPut(t, m, "k", "v", 10*time.Second)
	clock.Advance(10*time.Second - time.Nanosecond)
	if !present(t, m, "k") {
		t.Fatalf("key gone before its TTL")
	}
	if n := m.Stored(); n != 1 {
		t.Fatalf("Stored = %d, want 1", n)
	}
	clock.Advance(time.Nanosecond)
	if present(t, m, "k") {
		t.Fatalf("key visible at its expiry instant")
	}
	// The read removed it.
	if n := m.Stored(); n != 0 {
		t.Fatalf("Stored after reading an expired key = %d, want 0", n)
	}

	// Update sees an expired key as absent.
	mustPut(t, m, "k", "v", time.Second)
	clock.Advance(time.Second)
	_, ok, err := m.Update(context.Background(), "k", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		if ok || cur != nil {
			t.Errorf("fn(%q, %v) on an expired key", cur, ok)
		}
		return nil, 0, store.Keep
	})
	if err != nil || ok {
		t.Fatalf("Update(Keep) on expired = %v, %v", ok, err)
	}
	if n := m.Stored(); n != 0 {
		t.Fatalf("Stored after updating an expired key = %d, want 0", n)
	}
}

func TestMemorySweep(t *testing.T) {
	clock := newFakeClock()
	m := store.NewMemory(store.MemoryConfig{Now: clock.Now})
	const n = 100
	for i := range n {
		mustPut(t, m, "old"+strconv.Itoa(i), "v", time.Second)
	}
	mustPut(t, m, "live", "v", time.Hour)
	clock.Advance(2 * time.Second)
	if got := m.Stored(); got != n+1 {
		t.Fatalf("Stored = %d before any write, want %d", got, n+1)
	}
	// Nobody reads the expired keys: writes alone sweep them, a bounded
	// batch at a time.
	for i := range n {
		mustPut(t, m, "live", "v"+strconv.Itoa(i), time.Hour)
		if m.Stored() == 1 {
			t.Logf("swept %d expired entries in %d writes", n, i+1)
			break
		}
	}
	if got := m.Stored(); got != 1 {
		t.Fatalf("Stored = %d after %d writes, want 1", got, n)
	}

	// Deletes sweep too, and Len sweeps everything.
	for i := range n {
		mustPut(t, m, "old"+strconv.Itoa(i), "v", time.Second)
	}
	clock.Advance(2 * time.Second)
	if err := m.Delete(context.Background(), "nothing"); err != nil {
		t.Fatal(err)
	}
	if got := m.Stored(); got >= n+1 {
		t.Fatalf("Delete swept nothing: Stored = %d", got)
	}
	if got := m.Len(); got != 1 {
		t.Fatalf("Len = %d, want 1", got)
	}
	if got := m.Stored(); got != 1 {
		t.Fatalf("Stored after Len = %d, want 1", got)
	}
}

func TestMemoryUpdateCallsFnOnce(t *testing.T) {
	m := store.NewMemory(store.MemoryConfig{})
	for _, op := range []store.Op{store.Keep, store.Put, store.Delete} {
		calls := 0
		_, _, err := m.Update(context.Background(), "k", func([]byte, bool) ([]byte, time.Duration, store.Op) {
			calls++
			return []byte("v"), time.Minute, op
		})
		if err != nil || calls != 1 {
			t.Fatalf("%v: fn called %d times, err %v", op, calls, err)
		}
	}
}

func TestMemorySubscribeNoLeak(t *testing.T) {
	m := store.NewMemory(store.MemoryConfig{})
	before := runtime.NumGoroutine()

	// Subscriptions ended by their context.
	const n = 100
	cancels := make([]func(), 0, n)
	ctxCancels := make([]context.CancelFunc, 0, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		_, c, err := m.Subscribe(ctx, "k"+strconv.Itoa(i%10))
		if err != nil {
			t.Fatal(err)
		}
		cancels = append(cancels, c)
		ctxCancels = append(ctxCancels, cancel)
	}
	if got := m.Subscribers(); got != n {
		t.Fatalf("Subscribers = %d, want %d", got, n)
	}
	for _, cancel := range ctxCancels {
		cancel()
	}
	waitFor(t, func() bool { return m.Subscribers() == 0 }, "subscriptions removed after ctx cancel")
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before }, "goroutines back to the baseline after ctx cancel")
	for _, c := range cancels {
		c() // after the ctx ended: still safe
	}

	// Subscriptions ended by cancel: removed at once, nothing lingers.
	for i := range n {
		_, c, err := m.Subscribe(context.Background(), "k"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		c()
	}
	if got := m.Subscribers(); got != 0 {
		t.Fatalf("Subscribers after cancel = %d, want 0", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	_, c, err := m.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	c()
	cancel()
	waitFor(t, func() bool { return runtime.NumGoroutine() <= before }, "goroutines back to the baseline after cancel")
}

// waitFor polls cond, yielding in between, for at most 5 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

func BenchmarkMemoryGet(b *testing.B) {
	m := store.NewMemory(store.MemoryConfig{})
	ctx := context.Background()
	const keys = 1024
	for i := range keys {
		mustPut(b, m, "key"+strconv.Itoa(i), "0123456789abcdef0123456789abcdef", time.Hour)
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = "key" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok, err := m.Get(ctx, names[i%keys]); err != nil || !ok {
			b.Fatalf("Get: %v, %v", ok, err)
		}
	}
}

func BenchmarkMemoryUpdate(b *testing.B) {
	m := store.NewMemory(store.MemoryConfig{})
	ctx := context.Background()
	const keys = 1024
	names := make([]string, keys)
	for i := range names {
		names[i] = "key" + strconv.Itoa(i)
	}
	val := []byte("0123456789abcdef0123456789abcdef")
	fn := func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		return val, time.Hour, store.Put
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := m.Update(ctx, names[i%keys], fn); err != nil {
			b.Fatalf("Update: %v", err)
		}
	}
}
