package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/redisstore"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
	"github.com/solveonce/solveonce/store/storetest"
)

// prefixes hands out a distinct key prefix per index, so tests can share one
// server without seeing each other's keys.
var prefixes atomic.Int64

func uniquePrefix() string {
	return "test" + strconv.FormatInt(prefixes.Add(1), 10) + ":"
}

// newIndex returns an Index on rdb, closed when tb ends.
func newIndex(tb testing.TB, rdb redis.UniversalClient, prefix string) *redisstore.Index {
	tb.Helper()
	idx := redisstore.New(rdb, prefix)
	tb.Cleanup(func() {
		if err := idx.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return idx
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func putFn(val string, ttl time.Duration) store.UpdateFunc {
	return func([]byte, bool) ([]byte, time.Duration, store.Op) { return []byte(val), ttl, store.Put }
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

// waitFor polls cond every tick for at most within.
func waitFor(t *testing.T, within, tick time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(tick)
	}
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	storetest.Run(t, func(t *testing.T) store.Index {
		return newIndex(t, rdb, uniquePrefix())
	})
}

func TestKeyScheme(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := testCtx(t)

	if got := redisstore.New(rdb, "").RedisKey("fp"); got != "solveonce:{fp}" {
		t.Fatalf("default prefix: RedisKey = %q", got)
	}
	idx := newIndex(t, rdb, "p:")
	for key, want := range map[string]string{
		"abc":   "p:{abc}",
		"a:b c": "p:{a:b c}",
		"":      "p:{}",
		"{a}":   "p:{e2F9}:b64",
		"a}":    "p:{YX0}:b64",
		"e2F9":  "p:{e2F9}",
	} {
		if got := idx.RedisKey(key); got != want {
			t.Errorf("RedisKey(%q) = %q, want %q", key, got, want)
		}
		if _, _, err := idx.Update(ctx, key, putFn("v", time.Hour)); err != nil {
			t.Fatal(err)
		}
		if n, err := rdb.Exists(ctx, want).Result(); err != nil || n != 1 {
			t.Errorf("key %q not stored under %q: %d, %v", key, want, n, err)
		}
		pttl, err := rdb.PTTL(ctx, want).Result()
		if err != nil || pttl <= 59*time.Minute || pttl > time.Hour {
			t.Errorf("PTTL(%q) = %v, %v; want about 1h", want, pttl, err)
		}
	}
	if idx.Channel() != "p:changes" {
		t.Errorf("Channel = %q", idx.Channel())
	}

	defer func() {
		if recover() == nil {
			t.Errorf("New with a braced prefix did not panic")
		}
	}()
	redisstore.New(rdb, "bad{")
}

func TestCrossReplica(t *testing.T) {
	srv := redistest.Start(t)
	prefix := uniquePrefix()
	a := newIndex(t, srv.Client(t), prefix)
	b := newIndex(t, srv.Client(t), prefix)
	ctx := testCtx(t)

	chA, cancelA, err := a.Subscribe(ctx, "fp")
	if err != nil {
		t.Fatal(err)
	}
	defer cancelA()
	chB, cancelB, err := b.Subscribe(ctx, "fp")
	if err != nil {
		t.Fatal(err)
	}
	defer cancelB()

	if _, _, err := b.Update(ctx, "fp", putFn("from-b", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !woken(chA, 5*time.Second) {
		t.Fatalf("A not woken by B's Update")
	}
	if !woken(chB, 5*time.Second) {
		t.Fatalf("B not woken by its own Update")
	}
	if v, ok, err := a.Get(ctx, "fp"); err != nil || !ok || string(v) != "from-b" {
		t.Fatalf("A reads %q, %v, %v; want B's write", v, ok, err)
	}
	if err := a.Delete(ctx, "fp"); err != nil {
		t.Fatal(err)
	}
	if !woken(chB, 5*time.Second) {
		t.Fatalf("B not woken by A's Delete")
	}
	if _, ok, err := b.Get(ctx, "fp"); err != nil || ok {
		t.Fatalf("B still sees the key A deleted: %v, %v", ok, err)
	}

	// Claims from both replicas at once: exactly one wins.
	var (
		wg   sync.WaitGroup
		wins atomic.Int32
	)
	for c := range 20 {
		idx := a
		if c%2 == 1 {
			idx = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := "claimer-" + strconv.Itoa(c)
			v, _, err := idx.Update(ctx, "claim", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
				if ok {
					return nil, 0, store.Keep
				}
				return []byte(me), time.Hour, store.Put
			})
			if err != nil {
				t.Errorf("claimer %d: %v", c, err)
				return
			}
			if string(v) == me {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := wins.Load(); n != 1 {
		t.Fatalf("%d claimers won across replicas; want 1", n)
	}
}

func TestConflictBound(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	other := srv.Client(t)
	idx := newIndex(t, rdb, uniquePrefix())
	ctx := testCtx(t)

	// An fn that (impurely, for the test) has another client write the key
	// each time: every EXEC aborts, so Update must give up, boundedly.
	calls := 0
	_, _, err := idx.Update(ctx, "hot", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		calls++
		if err := other.Set(ctx, idx.RedisKey("hot"), strconv.Itoa(calls), time.Hour).Err(); err != nil {
			t.Errorf("interfering write: %v", err)
		}
		return []byte("mine"), time.Hour, store.Put
	})
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("Update err = %v; want ErrConflict", err)
	}
	// Once on the read-only fast path, then once per transaction round.
	if calls != redisstore.MaxAttempts+1 {
		t.Fatalf("fn called %d times; want %d", calls, redisstore.MaxAttempts+1)
	}
	if v, _, err := idx.Get(ctx, "hot"); err != nil || string(v) == "mine" {
		t.Fatalf("a conflicting Update wrote: %q, %v", v, err)
	}
}

// A deadline that ends an Update during conflicts is reported as a
// conflict too: Redis answered, others won.
func TestConflictDeadline(t *testing.T) {
	srv := redistest.Start(t)
	other := srv.Client(t)
	idx := newIndex(t, srv.Client(t), uniquePrefix())
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	_, _, err := idx.Update(ctx, "hot", func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		_ = other.Set(context.Background(), idx.RedisKey("hot"), "theirs", time.Hour).Err()
		time.Sleep(5 * time.Millisecond)
		return []byte("mine"), time.Hour, store.Put
	})
	if !errors.Is(err, store.ErrConflict) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update err = %v; want ErrConflict and DeadlineExceeded", err)
	}
}

func TestSubscribeEnds(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := testCtx(t)
	// Warm the client first, so the baseline includes whatever it runs
	// for its own pool.
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	idx := redisstore.New(rdb, uniquePrefix())

	// Ended by ctx.
	sctx, scancel := context.WithCancel(ctx)
	for i := range 10 {
		if _, _, err := idx.Subscribe(sctx, "k"+strconv.Itoa(i%3)); err != nil {
			t.Fatal(err)
		}
	}
	if n := idx.Subscribers(); n != 10 {
		t.Fatalf("Subscribers = %d, want 10", n)
	}
	scancel()
	waitFor(t, 5*time.Second, time.Millisecond, func() bool { return idx.Subscribers() == 0 }, "subscriptions removed after ctx cancel")

	// Close wakes the remaining subscribers and refuses new ones.
	ch, cancel, err := idx.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := idx.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !woken(ch, time.Second) {
		t.Fatalf("Close did not wake a subscriber")
	}
	if _, _, err := idx.Subscribe(ctx, "k"); !errors.Is(err, redisstore.ErrClosed) {
		t.Fatalf("Subscribe after Close err = %v; want ErrClosed", err)
	}
	if err := idx.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The client is still the caller's and still works.
	if _, _, err := idx.Update(ctx, "k", putFn("v", time.Hour)); err != nil {
		t.Fatalf("Update after Close: %v", err)
	}
	// The pub/sub goroutines (ours and go-redis's) are gone.
	waitFor(t, 5*time.Second, 10*time.Millisecond, func() bool { return runtime.NumGoroutine() <= before },
		"goroutines back to the baseline after Close")
}

func TestSubscribeCanceledWhileStarting(t *testing.T) {
	srv := redistest.Start(t)
	idx := newIndex(t, srv.Client(t), uniquePrefix())
	ctx, cancel := context.WithTimeout(t.Context(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if _, c, err := idx.Subscribe(ctx, "k"); err == nil {
		c()
		t.Fatalf("Subscribe with an expired ctx succeeded")
	}
	// A later Subscribe starts the connection normally.
	ch, c, err := idx.Subscribe(testCtx(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	defer c()
	if _, _, err := idx.Update(testCtx(t), "k", putFn("v", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !woken(ch, 5*time.Second) {
		t.Fatalf("no wakeup")
	}
}

// shortTimeouts makes a client give up quickly on a dead server: short
// timeouts, one dial attempt per connection and no command retries (the
// caller decides whether to retry).
func shortTimeouts(o *redis.Options) {
	o.DialTimeout = 200 * time.Millisecond
	o.ReadTimeout = 200 * time.Millisecond
	o.WriteTimeout = 200 * time.Millisecond
	o.PoolTimeout = 300 * time.Millisecond
	o.DialerRetries = 1
	o.MaxRetries = -1
}

func TestOutage(t *testing.T) {
	srv := redistest.Start(t)
	idx := newIndex(t, srv.Client(t, shortTimeouts), uniquePrefix())
	ctx := testCtx(t)

	if _, _, err := idx.Update(ctx, "k", putFn("v", time.Hour)); err != nil {
		t.Fatal(err)
	}
	srv.Stop()

	start := time.Now()
	if _, _, err := idx.Update(ctx, "k", putFn("v2", time.Hour)); err == nil {
		t.Fatalf("Update against a stopped server succeeded")
	} else {
		t.Logf("Update while down: %v (after %v)", err, time.Since(start))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Update took %v to fail against a stopped server", d)
	}
	if _, _, err := idx.Get(ctx, "k"); err == nil {
		t.Fatalf("Get against a stopped server succeeded")
	}
	if err := idx.Ping(ctx); err == nil {
		t.Fatalf("Ping against a stopped server succeeded")
	}
	if err := idx.Delete(ctx, "k"); err == nil {
		t.Fatalf("Delete against a stopped server succeeded")
	}

	srv.Restart()
	restarted := time.Now()
	waitFor(t, 10*time.Second, 50*time.Millisecond, func() bool {
		_, _, err := idx.Update(ctx, "k", putFn("v3", time.Hour))
		return err == nil
	}, "Update works again after Restart")
	t.Logf("Update works again %v after Restart", time.Since(restarted))
	if v, ok, err := idx.Get(ctx, "k"); err != nil || !ok || string(v) != "v3" {
		t.Fatalf("Get after Restart = %q, %v, %v", v, ok, err)
	}
	if err := idx.Ping(ctx); err != nil {
		t.Fatalf("Ping after Restart: %v", err)
	}
}

func TestSubscribeSurvivesRestart(t *testing.T) {
	// A brief outage, and one long enough for go-redis to stop dialling
	// eagerly (its pool backs off after PoolSize failed dials).
	for _, outage := range []time.Duration{0, 2500 * time.Millisecond} {
		t.Run("outage "+outage.String(), func(t *testing.T) {
			testSubscribeSurvivesRestart(t, outage)
		})
	}
}

func testSubscribeSurvivesRestart(t *testing.T, outage time.Duration) {
	srv := redistest.Start(t)
	prefix := uniquePrefix()
	sub := newIndex(t, srv.Client(t), prefix)
	writer := newIndex(t, srv.Client(t, shortTimeouts), prefix)
	ctx := testCtx(t)

	ch, cancel, err := sub.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()

	srv.Stop()
	time.Sleep(outage)
	srv.Restart()
	restarted := time.Now()

	// Once the pub/sub connection is back, the subscriber is woken to
	// re-read whatever it may have missed.
	if !woken(ch, 15*time.Second) {
		t.Fatalf("subscriber not woken after the pub/sub connection recovered")
	}
	t.Logf("subscriber woken %v after Restart", time.Since(restarted))
	// And it receives changes again.
	waitFor(t, 10*time.Second, 50*time.Millisecond, func() bool {
		_, _, err := writer.Update(ctx, "k", putFn("after", time.Hour))
		return err == nil
	}, "writer works again after Restart")
	if !woken(ch, 5*time.Second) {
		t.Fatalf("subscriber not woken by a write after Restart")
	}

	// A new subscription on the same Index works too.
	ch2, cancel2, err := sub.Subscribe(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	if err := writer.Delete(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	if !woken(ch2, 5*time.Second) {
		t.Fatalf("new subscriber not woken after Restart")
	}
}

func BenchmarkRedisGet(b *testing.B) {
	srv := redistest.Start(b)
	idx := newIndex(b, srv.Client(b), uniquePrefix())
	ctx := context.Background()
	const keys = 128
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("key%d", i)
		if _, _, err := idx.Update(ctx, names[i], putFn("0123456789abcdef0123456789abcdef", time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok, err := idx.Get(ctx, names[i%keys]); err != nil || !ok {
			b.Fatalf("Get: %v, %v", ok, err)
		}
	}
}

func BenchmarkRedisUpdate(b *testing.B) {
	srv := redistest.Start(b)
	idx := newIndex(b, srv.Client(b), uniquePrefix())
	ctx := context.Background()
	const keys = 128
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("key%d", i)
	}
	fn := putFn("0123456789abcdef0123456789abcdef", time.Hour)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := idx.Update(ctx, names[i%keys], fn); err != nil {
			b.Fatalf("Update: %v", err)
		}
	}
}
