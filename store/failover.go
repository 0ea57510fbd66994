package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of FailoverConfig.
const (
	DefaultFailoverTimeout = 250 * time.Millisecond
	DefaultProbeMin        = 100 * time.Millisecond
	DefaultProbeMax        = 5 * time.Second
)

// maxDirty bounds the keys a degraded Failover remembers to copy back to
// the primary; writes beyond it still succeed locally but are not copied.
const maxDirty = 1 << 17

// FailoverConfig configures a Failover. Zero fields mean the documented
// default.
type FailoverConfig struct {
	// Timeout bounds every operation on the primary (and the start of a
	// subscription); past it the operation is served locally. 0 → 250ms.
	Timeout time.Duration
	// ProbeMin is the wait before the first probe of a failed primary; it
	// doubles per failed probe up to ProbeMax. 0 → 100ms and 5s.
	ProbeMin, ProbeMax time.Duration
	// Local configures the in-process index used while degraded.
	Local MemoryConfig
	// OnChange, when set, is called after every switch: degraded true with
	// the primary's error, or false on recovery. It must not block.
	OnChange func(degraded bool, err error)
}

// WithDefaults returns c with zero fields set to their defaults.
func (c FailoverConfig) WithDefaults() FailoverConfig {
	if c.Timeout <= 0 {
		c.Timeout = DefaultFailoverTimeout
	}
	if c.ProbeMin <= 0 {
		c.ProbeMin = DefaultProbeMin
	}
	if c.ProbeMax <= 0 {
		c.ProbeMax = DefaultProbeMax
	}
	c.ProbeMax = max(c.ProbeMax, c.ProbeMin)
	return c
}

// FailoverStats are a Failover's counters. All fields are updated
// atomically and may be read at any time (metrics read them when scraped).
type FailoverStats struct {
	Degradations  atomic.Int64 // switches from the primary to the local index
	Recoveries    atomic.Int64 // switches back to the primary
	PrimaryErrors atomic.Int64 // primary operations that failed or timed out
	Fallbacks     atomic.Int64 // operations served by the local index
	Probes        atomic.Int64 // pings of the primary while degraded
	Restored      atomic.Int64 // keys written while degraded and copied to the primary on recovery
	Untracked     atomic.Int64 // local writes not remembered for copying back (bound reached)
}

// Failover is an Index that fails open: it serves every operation from a
// primary (shared) index, bounded by a short timeout, and when the primary
// fails or is slow it switches, at once and for every later operation, to
// an in-process Memory. It then probes the primary with Ping on a doubling
// backoff and switches back as soon as a probe succeeds.
//
// While degraded, deduplication is exact within this process only: other
// replicas cannot see its claims and tasks, nor it theirs, and waiters
// subscribed to the primary fall back to polling. Nothing fails for the
// caller. On recovery, the keys written locally during the outage are
// copied to the primary where it has no value for them (the primary's data
// wins), so tasks created during the outage are shared from then on; the
// local index is then emptied.
//
// Errors that are not the primary's fault pass through without a switch:
// the caller's own cancellation, ErrInvalidUpdate and ErrConflict.
//
// Create a Failover with NewFailover and Close it when done; Close does not
// close the primary.
type Failover struct {
	// Stats are the Failover's counters.
	Stats FailoverStats

	primary Index
	cfg     FailoverConfig

	degraded atomic.Bool
	lastErr  atomic.Pointer[errBox] // the primary's last error; nil once recovered

	trip      chan struct{} // buffer 1: wakes the prober after a switch to degraded
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the prober has returned
	closeOnce sync.Once

	// mu is held shared by every operation on local and exclusively while
	// switching back, so no local write can slip in after its key was
	// copied to the primary.
	mu    sync.RWMutex
	local *Memory // replaced (under mu, exclusively) on recovery

	dirtyMu sync.Mutex // guards dirty
	dirty   map[string]struct{}
}

var _ Index = (*Failover)(nil)

type errBox struct{ err error }

// NewFailover returns a Failover over primary, healthy until the primary
// first fails. It starts the goroutine that probes the primary; Close stops
// it.
func NewFailover(primary Index, cfg FailoverConfig) *Failover {
	cfg = cfg.WithDefaults()
	f := &Failover{
		primary: primary,
		cfg:     cfg,
		trip:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		local:   NewMemory(cfg.Local),
		dirty:   make(map[string]struct{}),
	}
	go f.run()
	return f
}

// Degraded reports whether operations are being served by the local index
// because the primary failed.
func (f *Failover) Degraded() bool { return f.degraded.Load() }

// Err returns the primary's last error while degraded, and nil while
// healthy.
func (f *Failover) Err() error {
	if b := f.lastErr.Load(); b != nil && f.degraded.Load() {
		return b.err
	}
	return nil
}

// Get returns the value stored under key.
func (f *Failover) Get(ctx context.Context, key string) (val []byte, ok bool, err error) {
	err = f.do(ctx,
		func(ctx context.Context) error {
			val, ok, err = f.primary.Get(ctx, key)
			return err
		},
		func(local *Memory) error {
			val, ok, err = local.Get(ctx, key)
			return err
		})
	return val, ok, err
}

// Update atomically applies fn to key, on the primary or, while degraded,
// locally. fn may run more than once, as on any shared store.
func (f *Failover) Update(ctx context.Context, key string, fn UpdateFunc) (val []byte, ok bool, err error) {
	err = f.do(ctx,
		func(ctx context.Context) error {
			val, ok, err = f.primary.Update(ctx, key, fn)
			return err
		},
		func(local *Memory) error {
			var op Op
			val, ok, err = local.Update(ctx, key, func(cur []byte, ok bool) ([]byte, time.Duration, Op) {
				next, ttl, o := fn(cur, ok)
				op = o
				return next, ttl, o
			})
			if err == nil && op == Put {
				f.markDirty(key)
			}
			return err
		})
	return val, ok, err
}

// Delete removes key.
func (f *Failover) Delete(ctx context.Context, key string) error {
	return f.do(ctx,
		func(ctx context.Context) error { return f.primary.Delete(ctx, key) },
		func(local *Memory) error { return local.Delete(ctx, key) })
}

// Subscribe subscribes to key on the primary or, while degraded (or when
// the primary does not confirm the subscription within the timeout), on
// the local index. A subscription made on one side does not see changes on
// the other: after a switch its holder learns of changes only by
// re-reading, which the store.Index contract asks of it anyway.
func (f *Failover) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if !f.degraded.Load() {
		ch, cancel, err := f.subscribePrimary(ctx, key)
		if err == nil || !f.primaryFailed(ctx, err) {
			return ch, cancel, err
		}
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	f.Stats.Fallbacks.Add(1)
	return f.local.Subscribe(ctx, key)
}

// subscribePrimary subscribes on the primary with the subscription's
// lifetime tied to ctx but its start bounded by the timeout.
func (f *Failover) subscribePrimary(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	noop := func() {}
	sctx, stop := context.WithCancelCause(ctx)
	errSlow := fmt.Errorf("store: subscribe %q: primary did not confirm within %v: %w", key, f.cfg.Timeout, context.DeadlineExceeded)
	timer := time.AfterFunc(f.cfg.Timeout, func() { stop(errSlow) })
	ch, cancel, err := f.primary.Subscribe(sctx, key)
	if !timer.Stop() {
		// Too late: whatever came back is cut off by sctx.
		if err == nil {
			cancel()
		}
		stop(nil)
		return nil, noop, errSlow
	}
	if err != nil {
		stop(nil)
		return nil, noop, err
	}
	return ch, func() { cancel(); stop(nil) }, nil
}

// Ping reports whether the Failover can serve, which it always can (its
// local index is in-process); only a done ctx makes it fail. It checks the
// primary on the way, so a failure there switches to degraded like any
// failed operation. Readiness checks that want the primary's health use
// PingPrimary, Degraded or Err.
func (f *Failover) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: ping: %w", err)
	}
	if !f.degraded.Load() {
		_ = f.PingPrimary(ctx)
	}
	return nil
}

// PingPrimary pings the primary (bounded by the timeout) and returns its
// error; a failure switches to degraded like any failed operation.
func (f *Failover) PingPrimary(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()
	if err := f.primary.Ping(pctx); err != nil {
		f.primaryFailed(ctx, err)
		return fmt.Errorf("store: primary: %w", err)
	}
	return nil
}

// Close stops the prober and waits for it. It does not close the primary.
// The Failover keeps serving after Close, but never switches back once
// degraded. Close is safe to call more than once.
func (f *Failover) Close() error {
	f.closeOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}

// do runs onPrimary under the timeout while healthy, and onLocal (with mu
// held shared) while degraded or once onPrimary failed for the primary's
// sake.
func (f *Failover) do(ctx context.Context, onPrimary func(context.Context) error, onLocal func(*Memory) error) error {
	// Two rounds at most: a switch back between the check and the lock
	// sends the operation to the primary once more.
	for range 2 {
		if !f.degraded.Load() {
			pctx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
			err := onPrimary(pctx)
			cancel()
			if err == nil || !f.primaryFailed(ctx, err) {
				return err
			}
		}
		f.mu.RLock()
		if f.degraded.Load() {
			f.Stats.Fallbacks.Add(1)
			err := onLocal(f.local)
			f.mu.RUnlock()
			return err
		}
		f.mu.RUnlock()
	}
	// Flapping: serve locally rather than loop.
	f.mu.RLock()
	defer f.mu.RUnlock()
	f.Stats.Fallbacks.Add(1)
	return onLocal(f.local)
}

// primaryFailed classifies err from a primary operation made for a caller
// with ctx. It reports whether the failure is the primary's (then the
// Failover is degraded now) rather than the caller's.
func (f *Failover) primaryFailed(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, ErrInvalidUpdate) || errors.Is(err, ErrConflict) {
		return false
	}
	f.Stats.PrimaryErrors.Add(1)
	f.lastErr.Store(&errBox{err})
	if f.degraded.CompareAndSwap(false, true) {
		f.Stats.Degradations.Add(1)
		select {
		case f.trip <- struct{}{}:
		default:
		}
		if f.cfg.OnChange != nil {
			f.cfg.OnChange(true, err)
		}
	}
	return true
}

// markDirty remembers that key was written locally while degraded.
func (f *Failover) markDirty(key string) {
	f.dirtyMu.Lock()
	defer f.dirtyMu.Unlock()
	if _, ok := f.dirty[key]; ok {
		return
	}
	if len(f.dirty) >= maxDirty {
		f.Stats.Untracked.Add(1)
		return
	}
	f.dirty[key] = struct{}{}
}

// takeDirty returns the dirty keys and forgets them.
func (f *Failover) takeDirty() []string {
	f.dirtyMu.Lock()
	defer f.dirtyMu.Unlock()
	keys := make([]string, 0, len(f.dirty))
	for k := range f.dirty {
		keys = append(keys, k)
	}
	clear(f.dirty)
	return keys
}

// run is the prober: after every switch to degraded it pings the primary
// on a doubling backoff until it answers and the switch back succeeds, or
// until Close.
func (f *Failover) run() {
	defer close(f.done)
	for {
		select {
		case <-f.stop:
			return
		case <-f.trip:
		}
		wait := f.cfg.ProbeMin
		for f.degraded.Load() {
			timer := time.NewTimer(wait)
			select {
			case <-f.stop:
				timer.Stop()
				return
			case <-timer.C:
			}
			f.Stats.Probes.Add(1)
			if err := f.probe(); err != nil {
				f.lastErr.Store(&errBox{err})
				wait = min(2*wait, f.cfg.ProbeMax)
			}
		}
	}
}

// probe pings the primary and, when it answers, copies the local writes
// back and switches to it.
func (f *Failover) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
	err := f.primary.Ping(ctx)
	cancel()
	if err != nil {
		return err
	}
	// First pass without blocking operations: most keys are copied here.
	if err := f.restore(f.takeDirty()); err != nil {
		return err
	}
	// Second pass with local writes excluded, for the keys written during
	// the first; then switch.
	f.mu.Lock()
	if err := f.restore(f.takeDirty()); err != nil {
		f.mu.Unlock()
		return err
	}
	f.local = NewMemory(f.cfg.Local)
	f.lastErr.Store(nil)
	f.degraded.Store(false)
	f.mu.Unlock()
	f.Stats.Recoveries.Add(1)
	if f.cfg.OnChange != nil {
		f.cfg.OnChange(false, nil)
	}
	return nil
}

// restore copies keys from the local index to the primary, each only where
// the primary has no value, with the time it has left. On failure the keys
// not yet copied are marked dirty again. The caller holds mu (shared or
// exclusive) or is the only goroutine that replaces local: it is the
// prober.
func (f *Failover) restore(keys []string) error {
	for i, key := range keys {
		select {
		case <-f.stop:
			f.redirty(keys[i:])
			return errors.New("store: failover closed")
		default:
		}
		val, ttl, ok := f.local.getTTL(key)
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Timeout)
		copied := false
		_, _, err := f.primary.Update(ctx, key, func(_ []byte, present bool) ([]byte, time.Duration, Op) {
			copied = !present
			if present {
				return nil, 0, Keep
			}
			return val, max(ttl, time.Millisecond), Put
		})
		cancel()
		if err != nil {
			f.redirty(keys[i:])
			return fmt.Errorf("store: restore %q: %w", key, err)
		}
		if copied {
			f.Stats.Restored.Add(1)
		}
	}
	return nil
}

// redirty marks keys dirty again after a failed restore.
func (f *Failover) redirty(keys []string) {
	for _, k := range keys {
		f.markDirty(k)
	}
}
