// Package storetest is the conformance suite every store.Index
// implementation must pass. An implementation's tests call Run with a
// constructor that returns a fresh, empty index for each subtest.
//
// The suite uses real time only through short TTLs and bounded waits, so it
// runs unchanged against a shared store (Redis) whose clock cannot be faked.
// Every wait is bounded: no subtest can hang.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/store"
)

const (
	// opTimeout bounds each subtest's context.
	opTimeout = 30 * time.Second
	// wakeTimeout bounds the wait for a notification that must arrive.
	wakeTimeout = 5 * time.Second
	// quietWait is how long a subtest watches for a notification that must
	// not arrive.
	quietWait = 150 * time.Millisecond
	// longTTL is a TTL no subtest outlives.
	longTTL = time.Hour
)

// Run runs the conformance suite as subtests of t. newIndex must return a
// fresh, empty index for the subtest it is given, and arrange (with
// t.Cleanup) to release it.
func Run(t *testing.T, newIndex func(t *testing.T) store.Index) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, idx store.Index)
	}{
		{"get missing", testGetMissing},
		{"put get roundtrip", testPutGet},
		{"returned bytes are copies", testCopies},
		{"ttl expiry", testTTLExpiry},
		{"huge ttl", testHugeTTL},
		{"keep writes nothing", testKeepWritesNothing},
		{"delete op", testDeleteOp},
		{"delete missing ok", testDeleteMissing},
		{"update returns stored value", testUpdateReturns},
		{"invalid update writes nothing", testInvalidUpdate},
		{"canceled context", testCanceledContext},
		{"atomic increments", testAtomicIncrements},
		{"claim exactly one wins", testClaim},
		{"subscribe wakes on update", testSubscribeUpdate},
		{"subscribe wakes on delete", testSubscribeDelete},
		{"subscribe quiet on keep", testSubscribeKeep},
		{"subscribe cancel idempotent", testSubscribeCancel},
		{"key isolation", testKeyIsolation},
		{"ping", testPing},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newIndex(t))
		})
	}
}

// ctxFor returns a context that ends with the subtest or after opTimeout.
func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// put returns an UpdateFunc that stores val for ttl unconditionally.
func put(val []byte, ttl time.Duration) store.UpdateFunc {
	return func([]byte, bool) ([]byte, time.Duration, store.Op) { return val, ttl, store.Put }
}

// keep is an UpdateFunc that writes nothing.
func keep([]byte, bool) ([]byte, time.Duration, store.Op) { return nil, 0, store.Keep }

// del is an UpdateFunc that deletes the key.
func del([]byte, bool) ([]byte, time.Duration, store.Op) { return nil, 0, store.Delete }

func mustGet(ctx context.Context, t *testing.T, idx store.Index, key string) ([]byte, bool) {
	t.Helper()
	v, ok, err := idx.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return v, ok
}

func mustUpdate(ctx context.Context, t *testing.T, idx store.Index, key string, fn store.UpdateFunc) ([]byte, bool) {
	t.Helper()
	v, ok, err := idx.Update(ctx, key, fn)
	if err != nil {
		t.Fatalf("Update(%q): %v", key, err)
	}
	return v, ok
}

func mustSubscribe(ctx context.Context, t *testing.T, idx store.Index, key string) (<-chan struct{}, func()) {
	t.Helper()
	ch, cancel, err := idx.Subscribe(ctx, key)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", key, err)
	}
	t.Cleanup(cancel)
	return ch, cancel
}

// wantValue fails t unless key holds want.
func wantValue(ctx context.Context, t *testing.T, idx store.Index, key string, want []byte) {
	t.Helper()
	got, ok := mustGet(ctx, t, idx, key)
	if !ok {
		t.Fatalf("Get(%q): absent, want %q", key, want)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%q) = %q, want %q", key, got, want)
	}
}

// wantAbsent fails t unless key is absent.
func wantAbsent(ctx context.Context, t *testing.T, idx store.Index, key string) {
	t.Helper()
	if got, ok := mustGet(ctx, t, idx, key); ok {
		t.Fatalf("Get(%q) = %q, want absent", key, got)
	}
}

// woken reports whether ch delivers within d.
func woken(ch <-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ch:
		return true
	case <-timer.C:
		return false
	}
}

// drain empties ch's buffer without waiting.
func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// eventually polls cond every tick until it holds, failing t after within.
func eventually(t *testing.T, within, tick time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(tick)
	}
}

func testGetMissing(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	v, ok := mustGet(ctx, t, idx, "missing")
	if ok || v != nil {
		t.Fatalf("Get(missing) = %q, %v; want nil, false", v, ok)
	}
}

func testPutGet(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v1"), longTTL))
	wantValue(ctx, t, idx, "k", []byte("v1"))
	mustUpdate(ctx, t, idx, "k", put([]byte("v2"), longTTL))
	wantValue(ctx, t, idx, "k", []byte("v2"))
	// Binary values survive byte for byte, and so does an empty one.
	bin := []byte{0, 1, 2, 0xff, '\r', '\n', 0}
	mustUpdate(ctx, t, idx, "bin", put(bin, longTTL))
	wantValue(ctx, t, idx, "bin", bin)
	mustUpdate(ctx, t, idx, "empty", put([]byte{}, longTTL))
	if got, ok := mustGet(ctx, t, idx, "empty"); !ok || len(got) != 0 {
		t.Fatalf("Get(empty) = %q, %v; want empty, true", got, ok)
	}
}

func testCopies(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	in := []byte("original")
	mustUpdate(ctx, t, idx, "k", put(in, longTTL))
	in[0] = 'X' // the caller's slice after the write
	wantValue(ctx, t, idx, "k", []byte("original"))

	got, _ := mustGet(ctx, t, idx, "k")
	got[0] = 'Y' // a slice returned by Get
	wantValue(ctx, t, idx, "k", []byte("original"))

	ret, _ := mustUpdate(ctx, t, idx, "k", keep)
	ret[0] = 'Z' // a slice returned by Update(Keep)
	wantValue(ctx, t, idx, "k", []byte("original"))

	ret, _ = mustUpdate(ctx, t, idx, "k", put([]byte("second"), longTTL))
	ret[0] = 'W' // a slice returned by Update(Put)
	wantValue(ctx, t, idx, "k", []byte("second"))

	// fn mutating cur must not reach the store when it keeps.
	mustUpdate(ctx, t, idx, "k", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		if ok && len(cur) > 0 {
			cur[0] = 'Q'
		}
		return nil, 0, store.Keep
	})
	wantValue(ctx, t, idx, "k", []byte("second"))
}

func testTTLExpiry(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	const ttl = 250 * time.Millisecond
	start := time.Now()
	mustUpdate(ctx, t, idx, "short", put([]byte("v"), ttl))
	mustUpdate(ctx, t, idx, "long", put([]byte("v"), longTTL))
	if time.Since(start) < ttl/2 {
		// Only meaningful while the write is fresh; a very slow machine
		// skips this half rather than flaking.
		if _, ok := mustGet(ctx, t, idx, "short"); !ok {
			t.Fatalf("short-lived key absent right after Put")
		}
	}
	eventually(t, 5*time.Second, 20*time.Millisecond, func() bool {
		_, ok := mustGet(ctx, t, idx, "short")
		return !ok
	}, "key with a 250ms TTL expires")
	if elapsed := time.Since(start); elapsed < ttl-50*time.Millisecond {
		t.Fatalf("key expired after %v, before its TTL %v", elapsed, ttl)
	}
	// An expired key is absent to Update too.
	mustUpdate(ctx, t, idx, "short", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		if ok {
			t.Errorf("Update saw expired value %q", cur)
		}
		return nil, 0, store.Keep
	})
	wantValue(ctx, t, idx, "long", []byte("v"))

	// A Put replaces the TTL: refreshed with a long one, the key stays.
	mustUpdate(ctx, t, idx, "refresh", put([]byte("v"), ttl))
	mustUpdate(ctx, t, idx, "refresh", put([]byte("v2"), longTTL))
	time.Sleep(ttl + 100*time.Millisecond)
	wantValue(ctx, t, idx, "refresh", []byte("v2"))
}

func testHugeTTL(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), time.Duration(math.MaxInt64)))
	wantValue(ctx, t, idx, "k", []byte("v"))
}

func testKeepWritesNothing(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	calls := 0
	v, ok := mustUpdate(ctx, t, idx, "absent", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		calls++
		if ok || cur != nil {
			t.Errorf("fn(%q, %v) for an absent key; want nil, false", cur, ok)
		}
		return []byte("ignored"), longTTL, store.Keep
	})
	if calls == 0 {
		t.Fatalf("fn was not called")
	}
	if ok || v != nil {
		t.Fatalf("Update(Keep) on absent = %q, %v; want nil, false", v, ok)
	}
	wantAbsent(ctx, t, idx, "absent")

	mustUpdate(ctx, t, idx, "present", put([]byte("v"), longTTL))
	v, ok = mustUpdate(ctx, t, idx, "present", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		return []byte("ignored"), longTTL, store.Keep
	})
	if !ok || string(v) != "v" {
		t.Fatalf("Update(Keep) on present = %q, %v; want v, true", v, ok)
	}
	wantValue(ctx, t, idx, "present", []byte("v"))
}

func testDeleteOp(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	v, ok := mustUpdate(ctx, t, idx, "k", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		if !ok || string(cur) != "v" {
			t.Errorf("fn(%q, %v); want v, true", cur, ok)
		}
		return []byte("ignored"), longTTL, store.Delete
	})
	if ok || v != nil {
		t.Fatalf("Update(Delete) = %q, %v; want nil, false", v, ok)
	}
	wantAbsent(ctx, t, idx, "k")
	// Delete on an absent key is fine too.
	v, ok = mustUpdate(ctx, t, idx, "k", del)
	if ok || v != nil {
		t.Fatalf("Update(Delete) on absent = %q, %v; want nil, false", v, ok)
	}
}

func testDeleteMissing(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	if err := idx.Delete(ctx, "never-written"); err != nil {
		t.Fatalf("Delete(absent) = %v; want nil", err)
	}
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	for i := range 2 {
		if err := idx.Delete(ctx, "k"); err != nil {
			t.Fatalf("Delete #%d = %v", i+1, err)
		}
		wantAbsent(ctx, t, idx, "k")
	}
}

func testUpdateReturns(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	v, ok := mustUpdate(ctx, t, idx, "k", put([]byte("one"), longTTL))
	if !ok || string(v) != "one" {
		t.Fatalf("Update(Put one) = %q, %v", v, ok)
	}
	v, ok = mustUpdate(ctx, t, idx, "k", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		return append(append([]byte{}, cur...), "+two"...), longTTL, store.Put
	})
	if !ok || string(v) != "one+two" {
		t.Fatalf("Update(append) = %q, %v", v, ok)
	}
	v, ok = mustUpdate(ctx, t, idx, "k", keep)
	if !ok || string(v) != "one+two" {
		t.Fatalf("Update(Keep) = %q, %v", v, ok)
	}
	v, ok = mustUpdate(ctx, t, idx, "k", del)
	if ok || v != nil {
		t.Fatalf("Update(Delete) = %q, %v", v, ok)
	}
	v, ok = mustUpdate(ctx, t, idx, "k", keep)
	if ok || v != nil {
		t.Fatalf("Update(Keep) after delete = %q, %v", v, ok)
	}
}

func testInvalidUpdate(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	for _, ttl := range []time.Duration{0, -time.Second} {
		_, _, err := idx.Update(ctx, "k", put([]byte("bad"), ttl))
		if !errors.Is(err, store.ErrInvalidUpdate) {
			t.Fatalf("Update(Put, ttl %v) err = %v; want ErrInvalidUpdate", ttl, err)
		}
	}
	_, _, err := idx.Update(ctx, "k", func([]byte, bool) ([]byte, time.Duration, store.Op) {
		return []byte("bad"), longTTL, store.Op(200)
	})
	if !errors.Is(err, store.ErrInvalidUpdate) {
		t.Fatalf("Update(unknown op) err = %v; want ErrInvalidUpdate", err)
	}
	wantValue(ctx, t, idx, "k", []byte("v"))
}

func testCanceledContext(t *testing.T, idx store.Index) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := idx.Get(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Get(canceled) err = %v; want context.Canceled", err)
	}
	if _, _, err := idx.Update(ctx, "k", put([]byte("v"), longTTL)); !errors.Is(err, context.Canceled) {
		t.Errorf("Update(canceled) err = %v; want context.Canceled", err)
	}
	if err := idx.Delete(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Delete(canceled) err = %v; want context.Canceled", err)
	}
	if _, c, err := idx.Subscribe(ctx, "k"); err == nil {
		c()
		t.Errorf("Subscribe(canceled) err = nil; want an error")
	} else if c != nil {
		c() // a cancel returned with an error must still be safe to call
	}
	wantAbsent(ctxFor(t), t, idx, "k")
}

// updateRetrying is Update that retries on ErrConflict (which wrote
// nothing) a bounded number of times, counting the conflicts.
func updateRetrying(ctx context.Context, idx store.Index, key string, fn store.UpdateFunc, conflicts *int) ([]byte, bool, error) {
	for range 100 {
		v, ok, err := idx.Update(ctx, key, fn)
		if !errors.Is(err, store.ErrConflict) {
			return v, ok, err
		}
		*conflicts++
	}
	return nil, false, fmt.Errorf("still conflicting after 100 tries: %w", store.ErrConflict)
}

func testAtomicIncrements(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	const workers, perWorker = 50, 20
	incr := func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		n := 0
		if ok {
			var err error
			if n, err = strconv.Atoi(string(cur)); err != nil {
				return nil, 0, store.Keep // reported by the final check
			}
		}
		return []byte(strconv.Itoa(n + 1)), longTTL, store.Put
	}
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		conflicts int
		start     = make(chan struct{})
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var mine int
			defer func() {
				mu.Lock()
				conflicts += mine
				mu.Unlock()
			}()
			for i := range perWorker {
				if _, _, err := updateRetrying(ctx, idx, "counter", incr, &mine); err != nil {
					t.Errorf("worker %d increment %d: %v", w, i, err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if conflicts > 0 {
		t.Logf("%d ErrConflict retries", conflicts)
	}
	wantValue(ctx, t, idx, "counter", []byte(strconv.Itoa(workers*perWorker)))
}

func testClaim(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	const claimers = 32
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		wins  []string
		start = make(chan struct{})
	)
	for c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := []byte("claimer-" + strconv.Itoa(c))
			claim := func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
				if ok {
					return nil, 0, store.Keep
				}
				return me, longTTL, store.Put
			}
			<-start
			var conflicts int
			v, ok, err := updateRetrying(ctx, idx, "claim", claim, &conflicts)
			if err != nil {
				t.Errorf("claimer %d: %v", c, err)
				return
			}
			if !ok {
				t.Errorf("claimer %d: key absent after claim", c)
				return
			}
			if bytes.Equal(v, me) {
				mu.Lock()
				wins = append(wins, string(me))
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(wins) != 1 {
		t.Fatalf("%d claimers won (%q); want exactly 1", len(wins), wins)
	}
	wantValue(ctx, t, idx, "claim", []byte(wins[0]))
}

func testSubscribeUpdate(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	ch, _ := mustSubscribe(ctx, t, idx, "k")
	other, _ := mustSubscribe(ctx, t, idx, "k")
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	if !woken(ch, wakeTimeout) {
		t.Fatalf("no wakeup after Update(Put)")
	}
	if !woken(other, wakeTimeout) {
		t.Fatalf("second subscriber of the same key: no wakeup after Update(Put)")
	}
	// Wakeups do not block the writer: many writes with nobody reading.
	for i := range 10 {
		mustUpdate(ctx, t, idx, "k", put([]byte(strconv.Itoa(i)), longTTL))
	}
	if !woken(ch, wakeTimeout) {
		t.Fatalf("no wakeup after repeated writes")
	}
	mustUpdate(ctx, t, idx, "k", del)
	// The buffered wakeups may still hold one from the burst; the delete
	// must leave at least one pending.
	if !woken(ch, wakeTimeout) {
		t.Fatalf("no wakeup after Update(Delete)")
	}
}

func testSubscribeDelete(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	ch, _ := mustSubscribe(ctx, t, idx, "k")
	if err := idx.Delete(ctx, "k"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if !woken(ch, wakeTimeout) {
		t.Fatalf("no wakeup after Delete")
	}
}

func testSubscribeKeep(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	ch, _ := mustSubscribe(ctx, t, idx, "k")
	mustUpdate(ctx, t, idx, "k", keep)
	mustUpdate(ctx, t, idx, "absent", keep)
	if woken(ch, quietWait) {
		t.Fatalf("wakeup after Update(Keep)")
	}
	// Writes to other keys do not wake it either.
	mustUpdate(ctx, t, idx, "other", put([]byte("v"), longTTL))
	if err := idx.Delete(ctx, "other"); err != nil {
		t.Fatalf("Delete(other): %v", err)
	}
	if woken(ch, quietWait) {
		t.Fatalf("wakeup after writes to another key")
	}
}

func testSubscribeCancel(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	ch, cancel := mustSubscribe(ctx, t, idx, "k")
	cancel()
	cancel() // idempotent
	mustUpdate(ctx, t, idx, "k", put([]byte("v"), longTTL))
	if woken(ch, quietWait) {
		t.Fatalf("wakeup after cancel")
	}
	// The key can be subscribed again, and a canceled subscription does
	// not disturb a live one.
	live, _ := mustSubscribe(ctx, t, idx, "k")
	_, gone := mustSubscribe(ctx, t, idx, "k")
	gone()
	mustUpdate(ctx, t, idx, "k", put([]byte("v2"), longTTL))
	if !woken(live, wakeTimeout) {
		t.Fatalf("no wakeup for a new subscription after an old one was canceled")
	}

	// A subscription ends with its context too.
	sctx, scancel := context.WithCancel(ctx)
	_, c2 := mustSubscribe(sctx, t, idx, "k")
	scancel()
	c2() // cancel after ctx end is still safe
	c2()
}

// oddKeys are distinct keys that a naive key scheme might confuse.
var oddKeys = []string{
	"",
	"a",
	"A",
	"a ",
	" a",
	"a b",
	"a:b",
	"a::b",
	":",
	"{",
	"}",
	"{}",
	"}{",
	"{a}",
	"a}",
	"{a",
	"{a}:b64",
	"e2F9", // base64url of "{a}"
	"YX0",  // base64url of "a}"
	"solveonce:",
	"solveonce:{a}",
	"changes",
	"ключ",
	"键",
	"🔑",
	"\x00",
	"\x00\xff",
	"\xff\xfe",
	"tab\tnew\nline\r",
	"*",
	"?",
	"[a]",
	"a\\b",
	"%s",
}

func testKeyIsolation(t *testing.T, idx store.Index) {
	ctx := ctxFor(t)
	seen := make(map[string]bool, len(oddKeys))
	for i, k := range oddKeys {
		if seen[k] {
			t.Fatalf("test bug: key %q listed twice", k)
		}
		seen[k] = true
		mustUpdate(ctx, t, idx, k, put([]byte(fmt.Sprintf("value-%d", i)), longTTL))
	}
	for i, k := range oddKeys {
		wantValue(ctx, t, idx, k, []byte(fmt.Sprintf("value-%d", i)))
	}
	// Deleting one key leaves the others.
	if err := idx.Delete(ctx, "{a}"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantAbsent(ctx, t, idx, "{a}")
	for i, k := range oddKeys {
		if k != "{a}" {
			wantValue(ctx, t, idx, k, []byte(fmt.Sprintf("value-%d", i)))
		}
	}
	// Notifications are per key too.
	ch, _ := mustSubscribe(ctx, t, idx, "{a}")
	for _, k := range []string{"a", "a}", "{a", "e2F9", "{a}:b64"} {
		mustUpdate(ctx, t, idx, k, put([]byte("x"), longTTL))
	}
	if woken(ch, quietWait) {
		t.Fatalf("subscriber of {a} woken by writes to look-alike keys")
	}
	drain(ch)
	mustUpdate(ctx, t, idx, "{a}", put([]byte("x"), longTTL))
	if !woken(ch, wakeTimeout) {
		t.Fatalf("subscriber of {a} not woken by its own key")
	}
}

func testPing(t *testing.T, idx store.Index) {
	if err := idx.Ping(ctxFor(t)); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
