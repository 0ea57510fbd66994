package store_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/storetest"
)

// Modes of a flaky primary.
const (
	up   int32 = iota // works
	down              // fails at once (connection refused)
	hang              // blocks until the caller's context ends (a stalled server)
)

var errDown = errors.New("flaky: connection refused")

// flaky is a primary index that can be switched between working, failing
// and hanging, and counts the calls that reached it.
type flaky struct {
	mem   *store.Memory
	mode  atomic.Int32
	calls atomic.Int64
}

func newFlaky() *flaky { return &flaky{mem: store.NewMemory(store.MemoryConfig{})} }

func (p *flaky) check(ctx context.Context) error {
	p.calls.Add(1)
	if err := ctx.Err(); err != nil {
		return err
	}
	switch p.mode.Load() {
	case down:
		return errDown
	case hang:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (p *flaky) Get(ctx context.Context, key string) ([]byte, bool, error) {
	if err := p.check(ctx); err != nil {
		return nil, false, err
	}
	return p.mem.Get(ctx, key)
}

func (p *flaky) Update(ctx context.Context, key string, fn store.UpdateFunc) ([]byte, bool, error) {
	if err := p.check(ctx); err != nil {
		return nil, false, err
	}
	return p.mem.Update(ctx, key, fn)
}

func (p *flaky) Delete(ctx context.Context, key string) error {
	if err := p.check(ctx); err != nil {
		return err
	}
	return p.mem.Delete(ctx, key)
}

func (p *flaky) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := p.check(ctx); err != nil {
		return nil, func() {}, err
	}
	return p.mem.Subscribe(ctx, key)
}

func (p *flaky) Ping(ctx context.Context) error { return p.check(ctx) }

// newFailover returns a Failover over p, closed when tb ends.
func newFailover(tb testing.TB, p store.Index, cfg store.FailoverConfig) *store.Failover {
	tb.Helper()
	f := store.NewFailover(p, cfg)
	tb.Cleanup(func() { _ = f.Close() })
	return f
}

// The Failover is a complete Index whether its primary works, fails or
// hangs: failing open loses no semantics within the process.
func TestFailoverConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode int32
	}{{"primary up", up}, {"primary down", down}, {"primary hanging", hang}} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) store.Index {
				p := newFlaky()
				p.mode.Store(tc.mode)
				return newFailover(t, p, store.FailoverConfig{Timeout: 20 * time.Millisecond})
			})
		})
	}
}

func putFor(val string, ttl time.Duration) store.UpdateFunc {
	return func([]byte, bool) ([]byte, time.Duration, store.Op) { return []byte(val), ttl, store.Put }
}

// A hanging primary costs one operation the timeout; every later operation
// is served locally at once, without touching the primary.
func TestFailoverSwitchesWithinTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFlaky()
		p.mode.Store(hang)
		var changes []bool
		var mu sync.Mutex
		f := newFailover(t, p, store.FailoverConfig{
			Timeout:  250 * time.Millisecond,
			ProbeMin: time.Hour, // no probe during this test
			OnChange: func(d bool, err error) {
				mu.Lock()
				changes = append(changes, d)
				mu.Unlock()
				if d && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("OnChange err = %v; want a deadline", err)
				}
			},
		})
		ctx := t.Context()
		start := time.Now()
		if _, _, err := f.Update(ctx, "k", putFor("v", time.Minute)); err != nil {
			t.Fatalf("Update: %v", err)
		}
		if d := time.Since(start); d != 250*time.Millisecond {
			t.Fatalf("first Update took %v; want the 250ms timeout", d)
		}
		if !f.Degraded() || f.Err() == nil {
			t.Fatalf("Degraded() = %v, Err() = %v after a timeout", f.Degraded(), f.Err())
		}
		calls := p.calls.Load()
		v, ok, err := f.Get(ctx, "k")
		if err != nil || !ok || string(v) != "v" {
			t.Fatalf("Get = %q, %v, %v; want the local write", v, ok, err)
		}
		if d := time.Since(start); d != 250*time.Millisecond {
			t.Fatalf("degraded Get waited: %v", d-250*time.Millisecond)
		}
		if p.calls.Load() != calls {
			t.Fatalf("a degraded operation reached the primary")
		}
		if got := f.Stats.Degradations.Load(); got != 1 {
			t.Fatalf("Degradations = %d; want 1", got)
		}
		if got := f.Stats.Fallbacks.Load(); got != 2 {
			t.Fatalf("Fallbacks = %d; want 2", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(changes) != 1 || !changes[0] {
			t.Fatalf("OnChange calls = %v; want [true]", changes)
		}
	})
}

// The prober backs off (100ms, 200ms, 400ms, …, capped) and switches back
// when the primary answers, copying the local writes the primary lacks.
func TestFailoverProbesAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFlaky()
		ctx := t.Context()
		// Written before the outage; the primary's value must win.
		if _, _, err := p.mem.Update(ctx, "both", putFor("primary", time.Hour)); err != nil {
			t.Fatal(err)
		}
		p.mode.Store(down)
		f := newFailover(t, p, store.FailoverConfig{ProbeMin: 100 * time.Millisecond, ProbeMax: 400 * time.Millisecond})

		if _, _, err := f.Update(ctx, "both", putFor("local", time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Update(ctx, "new", putFor("local", 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := f.Update(ctx, "gone", putFor("local", time.Second)); err != nil {
			t.Fatal(err)
		}
		if !f.Degraded() {
			t.Fatal("not degraded after a refused operation")
		}
		// Probes at +100, +300, +700, +1100, +1500 ms.
		for _, step := range []struct {
			after  time.Duration
			probes int64
		}{{99 * time.Millisecond, 0}, {2 * time.Millisecond, 1}, {200 * time.Millisecond, 2}, {400 * time.Millisecond, 3}, {400 * time.Millisecond, 4}, {400 * time.Millisecond, 5}} {
			time.Sleep(step.after)
			synctest.Wait()
			if got := f.Stats.Probes.Load(); got != step.probes {
				t.Fatalf("at +%v: %d probes; want %d", step.after, got, step.probes)
			}
		}
		if !f.Degraded() {
			t.Fatal("recovered while the primary is down")
		}

		p.mode.Store(up)
		time.Sleep(400 * time.Millisecond)
		synctest.Wait()
		if f.Degraded() || f.Err() != nil {
			t.Fatalf("Degraded() = %v, Err() = %v after the primary came back", f.Degraded(), f.Err())
		}
		if got := f.Stats.Recoveries.Load(); got != 1 {
			t.Fatalf("Recoveries = %d; want 1", got)
		}
		// "both": the primary's value wins; "new": copied with the time it
		// had left; "gone": expired locally, not copied.
		for key, want := range map[string]string{"both": "primary", "new": "local"} {
			v, ok, err := p.mem.Get(ctx, key)
			if err != nil || !ok || string(v) != want {
				t.Fatalf("primary %q = %q, %v, %v; want %q", key, v, ok, err, want)
			}
		}
		if _, ok, _ := p.mem.Get(ctx, "gone"); ok {
			t.Fatalf("an expired local key was copied")
		}
		if got := f.Stats.Restored.Load(); got != 1 {
			t.Fatalf("Restored = %d; want 1", got)
		}
		time.Sleep(10 * time.Second)
		if _, ok, _ := p.mem.Get(ctx, "new"); ok {
			t.Fatalf("copied key outlived its local TTL")
		}
		// Operations reach the primary again.
		calls := p.calls.Load()
		if _, _, err := f.Get(ctx, "both"); err != nil {
			t.Fatal(err)
		}
		if p.calls.Load() != calls+1 {
			t.Fatalf("Get after recovery did not reach the primary")
		}
		// A second outage starts from an empty local index.
		p.mode.Store(down)
		if _, ok, err := f.Get(ctx, "both"); err != nil || ok {
			t.Fatalf("Get in a second outage = %v, %v; want a clean local miss", ok, err)
		}
		if got := f.Stats.Degradations.Load(); got != 2 {
			t.Fatalf("Degradations = %d; want 2", got)
		}
	})
}

// Errors that are not the primary's fault pass through and do not degrade.
func TestFailoverCallerErrorsPassThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFlaky()
		p.mode.Store(hang)
		f := newFailover(t, p, store.FailoverConfig{Timeout: time.Second})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		if _, _, err := f.Get(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get with the caller's short deadline: %v", err)
		}
		if f.Degraded() {
			t.Fatal("the caller's own deadline degraded the Failover")
		}

		p.mode.Store(up)
		_, _, err := f.Update(t.Context(), "k", putFor("v", 0))
		if !errors.Is(err, store.ErrInvalidUpdate) {
			t.Fatalf("Update with ttl 0: %v; want ErrInvalidUpdate", err)
		}
		if f.Degraded() || f.Stats.PrimaryErrors.Load() != 0 {
			t.Fatal("an invalid update degraded the Failover")
		}
	})
}

func TestFailoverSubscribe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFlaky()
		f := newFailover(t, p, store.FailoverConfig{ProbeMin: time.Hour})
		ctx := t.Context()

		// Healthy: on the primary, so writes by other processes wake it.
		ch, cancel, err := f.Subscribe(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := p.mem.Update(ctx, "k", putFor("other replica", time.Hour)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case <-ch:
		default:
			t.Fatal("primary subscription not woken")
		}
		cancel()
		cancel()
		if n := p.mem.Subscribers(); n != 0 {
			t.Fatalf("%d primary subscriptions after cancel", n)
		}

		// A hanging primary: the subscription is made locally within the
		// timeout, and local writes wake it.
		p.mode.Store(hang)
		start := time.Now()
		ch, cancel, err = f.Subscribe(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		if d := time.Since(start); d != store.DefaultFailoverTimeout {
			t.Fatalf("Subscribe took %v", d)
		}
		if !f.Degraded() {
			t.Fatal("a hanging Subscribe did not degrade")
		}
		if _, _, err := f.Update(ctx, "k", putFor("local", time.Hour)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case <-ch:
		default:
			t.Fatal("local subscription not woken")
		}
		if n := p.mem.Subscribers(); n != 0 {
			t.Fatalf("%d primary subscriptions left by the timed-out Subscribe", n)
		}
	})
}

// Ping says the Failover can serve; PingPrimary reports the primary's
// health; both degrade on the primary's failure.
func TestFailoverPing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newFlaky()
		f := newFailover(t, p, store.FailoverConfig{})
		if err := f.PingPrimary(t.Context()); err != nil {
			t.Fatal(err)
		}
		p.mode.Store(down)
		if err := f.PingPrimary(t.Context()); !errors.Is(err, errDown) {
			t.Fatalf("PingPrimary = %v; want errDown", err)
		}
		if !f.Degraded() {
			t.Fatal("failed PingPrimary did not degrade")
		}
		if err := f.Ping(t.Context()); err != nil {
			t.Fatalf("Ping while degraded = %v; want nil (it serves locally)", err)
		}
		p.mode.Store(up)
		time.Sleep(store.DefaultProbeMin)
		synctest.Wait()
		if f.Degraded() {
			t.Fatal("not recovered after the first successful probe")
		}
	})
}

// Writes racing with the switch back are never lost: every key written
// while degraded is on the primary afterwards, copied or written there.
func TestFailoverRecoveryLosesNoWrites(t *testing.T) {
	p := newFlaky()
	p.mode.Store(down)
	f := newFailover(t, p, store.FailoverConfig{ProbeMin: time.Millisecond, ProbeMax: time.Millisecond})
	ctx := t.Context()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written []string
	)
	stop := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "w" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				if _, _, err := f.Update(ctx, key, putFor("v", time.Hour)); err != nil {
					t.Errorf("Update(%s): %v", key, err)
					return
				}
				mu.Lock()
				written = append(written, key)
				mu.Unlock()
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if !f.Degraded() {
		t.Fatal("not degraded")
	}
	p.mode.Store(up)
	deadline := time.Now().Add(10 * time.Second)
	for f.Degraded() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // some writes after the switch too
	close(stop)
	wg.Wait()
	if f.Degraded() {
		t.Fatal("never recovered")
	}
	for _, key := range written {
		if _, ok, err := p.mem.Get(ctx, key); err != nil || !ok {
			t.Fatalf("key %s written during the outage is missing from the primary", key)
		}
	}
	t.Logf("%d writes, %d restored on recovery", len(written), f.Stats.Restored.Load())
}
