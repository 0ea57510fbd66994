package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/redisstore"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
	"github.com/solveonce/solveonce/store/storetest"
)

// honourDeadlines makes the client bound each command by its context's
// deadline, as solveonce configures it: the Failover's timeout then governs.
func honourDeadlines(o *redis.Options) {
	o.ContextTimeoutEnabled = true
	o.DialTimeout = 250 * time.Millisecond
}

// newRedisFailover returns a Failover over a new Index on rdb under
// prefix, both closed when t ends.
func newRedisFailover(t *testing.T, rdb redis.UniversalClient, prefix string, cfg store.FailoverConfig) *store.Failover {
	t.Helper()
	f := store.NewFailover(newIndex(t, rdb, prefix), cfg)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

var _ store.Index = (*redisstore.Index)(nil)

// The Failover over a healthy Redis is a conforming shared index. The
// suite checks semantics, not speed: its 50-writer contention on one key
// under the race detector can starve a client past the 250ms default, and
// a slow primary is, by design, a reason to fail over (which splits the
// counter). So this run allows seconds; TestFailoverOutage checks timing.
func TestFailoverConformance(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, honourDeadlines)
	storetest.Run(t, func(t *testing.T) store.Index {
		f := newRedisFailover(t, rdb, uniquePrefix(), store.FailoverConfig{Timeout: 10 * time.Second})
		t.Cleanup(func() {
			if f.Stats.Degradations.Load() > 0 {
				t.Errorf("degraded against a healthy Redis: %v", f.Err())
			}
		})
		return f
	})
}

// A real outage: operations keep succeeding (locally) within the timeout,
// and after Restart the Failover switches back on its own and copies what
// was written meanwhile to the (empty) restarted server.
func TestFailoverOutage(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, honourDeadlines)
	prefix := uniquePrefix()
	f := newRedisFailover(t, rdb, prefix, store.FailoverConfig{ProbeMax: 200 * time.Millisecond})
	other := newIndex(t, srv.Client(t), prefix)
	ctx := testCtx(t)

	if _, _, err := f.Update(ctx, "before", putFn("v", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if f.Degraded() {
		t.Fatal("degraded with Redis up")
	}

	srv.Stop()
	start := time.Now()
	if _, _, err := f.Update(ctx, "during", putFn("local", time.Hour)); err != nil {
		t.Fatalf("Update during the outage: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("first Update during the outage took %v; want under a second", d)
	}
	if !f.Degraded() || f.Err() == nil {
		t.Fatalf("Degraded() = %v, Err() = %v during the outage", f.Degraded(), f.Err())
	}
	t.Logf("switched to local after %v: %v", time.Since(start), f.Err())
	start = time.Now()
	for range 100 {
		if v, ok, err := f.Get(ctx, "during"); err != nil || !ok || string(v) != "local" {
			t.Fatalf("Get during the outage = %q, %v, %v", v, ok, err)
		}
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("100 degraded Gets took %v", d)
	}
	ch, cancel, err := f.Subscribe(ctx, "during")
	if err != nil {
		t.Fatalf("Subscribe during the outage: %v", err)
	}
	defer cancel()
	if err := f.Delete(ctx, "during"); err != nil {
		t.Fatal(err)
	}
	if !woken(ch, time.Second) {
		t.Fatal("local subscription not woken")
	}
	if _, _, err := f.Update(ctx, "during", putFn("local2", time.Hour)); err != nil {
		t.Fatal(err)
	}

	srv.Restart()
	restarted := time.Now()
	waitFor(t, 10*time.Second, 10*time.Millisecond, func() bool { return !f.Degraded() }, "switch back after Restart")
	t.Logf("switched back %v after Restart (%d probes)", time.Since(restarted), f.Stats.Probes.Load())
	// The restarted server kept nothing, but got what was written locally;
	// another replica sees it.
	waitFor(t, 5*time.Second, 10*time.Millisecond, func() bool {
		v, ok, err := other.Get(ctx, "during")
		return err == nil && ok && string(v) == "local2"
	}, "the outage's write visible to another replica")
	if f.Stats.Degradations.Load() != 1 || f.Stats.Recoveries.Load() != 1 || f.Stats.Restored.Load() < 1 {
		t.Fatalf("stats: %d degradations, %d recoveries, %d restored", f.Stats.Degradations.Load(), f.Stats.Recoveries.Load(), f.Stats.Restored.Load())
	}
}
