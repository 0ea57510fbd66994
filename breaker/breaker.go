// Package breaker stops solveonce calling CaptchaAI while CaptchaAI is failing.
//
// A Circuit wraps github.com/sony/gobreaker/v2 (no other package imports
// gobreaker) behind a small two-step API:
//
//	done, err := c.Allow()
//	if err != nil {
//		return err // errors.Is(err, breaker.ErrOpen)
//	}
//	resp, err := callCaptchaAI(ctx, req)
//	done(breaker.Outcome(ctx, err))
//
// Every admitted call must be finished with exactly one call to done. The
// error given to done is classified as follows:
//
//   - nil is a success;
//   - an excluded error counts as neither success nor failure: an error
//     marked by Outcome (the caller's own context ended the call) or any error
//     matching context.Canceled (only a caller cancels; CaptchaAI failing never
//     produces it);
//   - otherwise the isFailure function given to New decides: true is a
//     failure, false a success (for example an error about the request or the
//     account, which says nothing about CaptchaAI's health).
//
// context.DeadlineExceeded on its own is NOT excluded, because solveonce's
// own timeouts on CaptchaAI calls produce it too and a slow CaptchaAI is a
// failing one; pass such errors through Outcome with the caller's context so
// that only the caller's deadline is excluded.
package breaker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// State is the state of a Circuit.
type State int32

// The states of a Circuit.
const (
	// Closed lets every call through and watches the outcomes.
	Closed State = iota
	// HalfOpen lets Config.Probes calls through to test whether CaptchaAI
	// has recovered, and rejects the rest.
	HalfOpen
	// Open rejects every call until Config.OpenFor has elapsed.
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	default:
		return "state(" + strconv.Itoa(int(s)) + ")"
	}
}

// ErrOpen is what Allow's error wraps when the circuit rejects a call, both
// because it is open and because it is half-open with all probes already
// admitted. Test for it with errors.Is.
var ErrOpen = errors.New("breaker: circuit open")

// Outcome prepares the result err of a call made under ctx for done. If ctx
// has ended and err matches context.Canceled or context.DeadlineExceeded,
// the caller gave up and the call says nothing about CaptchaAI's health:
// Outcome returns err marked so that done excludes it (the mark keeps err's
// chain, so errors.Is(Outcome(ctx, err), context.DeadlineExceeded) still
// holds). In every other case, including a deadline that expired while ctx is
// still live, Outcome returns err unchanged.
func Outcome(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &callerGone{err}
	}
	return err
}

// callerGone marks an error as caused by the caller giving up.
type callerGone struct{ err error }

func (e *callerGone) Error() string { return e.err.Error() }
func (e *callerGone) Unwrap() error { return e.err }

// excluded reports whether done must count err as neither success nor failure.
func excluded(err error) bool {
	if err == nil {
		return false
	}
	var cg *callerGone
	return errors.As(err, &cg) || errors.Is(err, context.Canceled)
}

// change is one state transition waiting to be reported to the observer.
type change struct{ from, to State }

// Circuit is a circuit breaker in front of one upstream. It is safe for
// concurrent use. Create one with New.
type Circuit struct {
	name    string
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	openFor time.Duration
	epoch   time.Time // monotonic origin for openUntil

	errOpen error // rejection while open; wraps ErrOpen
	errBusy error // rejection while half-open with all probes out; wraps ErrOpen

	// Written only by the gobreaker state hook (under gobreaker's mutex).
	state       atomic.Int32 // State
	transitions atomic.Uint64
	openUntil   atomic.Int64 // time.Since(epoch) at which Open ends, in ns

	// Observer delivery, outside gobreaker's mutex.
	observer   atomic.Pointer[func(from, to State)]
	evMu       sync.Mutex // leaf lock guarding events; never held across a call
	events     []change
	pending    atomic.Int64 // len(events), readable without evMu
	delivering atomic.Bool  // one goroutine delivers at a time, in order
}

// New builds a circuit named name (the name appears in rejection errors)
// from cfg, whose zero fields take their defaults (see Config.WithDefaults).
//
// isFailure classifies the non-nil, non-excluded errors passed to done: true
// counts as a failure, false as a success. A nil isFailure counts every such
// error as a failure. isFailure is called while gobreaker holds its lock, so
// it must be quick and must not call back into the Circuit. See the package
// documentation for the full classification, including exclusion.
func New(name string, cfg Config, isFailure func(error) bool) *Circuit {
	cfg = cfg.WithDefaults()
	if isFailure == nil {
		isFailure = func(error) bool { return true }
	}
	c := &Circuit{
		name:    name,
		openFor: cfg.OpenFor,
		epoch:   time.Now(),
		errOpen: fmt.Errorf("%w: %q is open", ErrOpen, name),
		errBusy: fmt.Errorf("%w: %q is half-open and its probes are in flight", ErrOpen, name),
	}

	bucket := cfg.Window / windowBuckets
	interval := cfg.Window
	if bucket <= 0 { // a window of a few nanoseconds: fixed window
		bucket = 0
	}

	minRequests := uint64(cfg.MinRequests)
	ratio := cfg.FailureRatio
	run := cfg.ConsecutiveFailures

	c.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  cfg.Probes,
		Interval:     interval,
		BucketPeriod: bucket,
		Timeout:      cfg.OpenFor,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			if n.ConsecutiveFailures >= run {
				return true
			}
			finished := uint64(n.TotalSuccesses) + uint64(n.TotalFailures)
			return finished >= minRequests && float64(n.TotalFailures) >= ratio*float64(finished)
		},
		OnStateChange: c.hook,
		IsSuccessful: func(err error) bool {
			return err == nil || !isFailure(err)
		},
		IsExcluded: excluded,
	})
	return c
}

// hook is gobreaker's OnStateChange. gobreaker calls it with its mutex held,
// so it only stores atomics and queues the change; the observer runs later,
// from notify, once gobreaker has released its mutex.
func (c *Circuit) hook(_ string, from, to gobreaker.State) {
	f, t := fromGobreaker(from), fromGobreaker(to)
	if t == Open {
		// Stored before state, so whoever sees Open sees its deadline.
		// gobreaker took its own clock reading a moment earlier, so this
		// deadline is never before gobreaker's.
		c.openUntil.Store(int64(time.Since(c.epoch) + c.openFor))
	}
	c.state.Store(int32(t))
	c.transitions.Add(1)
	if c.observer.Load() != nil {
		c.evMu.Lock()
		c.events = append(c.events, change{f, t})
		c.pending.Add(1)
		c.evMu.Unlock()
	}
}

// notify delivers queued changes to the observer, in order, on the calling
// goroutine. It must be called after every call into gobreaker, never while
// gobreaker's mutex is held. If another goroutine is already delivering,
// notify leaves the work to it: that goroutine re-checks for pending changes
// after it stops, so no change is lost. The observer may therefore call back
// into the Circuit (a change it causes is delivered by the same loop).
func (c *Circuit) notify() {
	for c.pending.Load() > 0 {
		if !c.delivering.CompareAndSwap(false, true) {
			return
		}
		c.deliver()
	}
}

// deliver drains the queue; the caller owns c.delivering.
func (c *Circuit) deliver() {
	defer c.delivering.Store(false) // even if the observer panics
	for {
		c.evMu.Lock()
		if len(c.events) == 0 {
			c.events = nil
			c.evMu.Unlock()
			return
		}
		ev := c.events[0]
		c.events = c.events[1:]
		c.pending.Add(-1)
		c.evMu.Unlock()
		if f := c.observer.Load(); f != nil {
			(*f)(ev.from, ev.to)
		}
	}
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	default:
		return Closed
	}
}

// Name returns the name the circuit was built with.
func (c *Circuit) Name() string { return c.name }

// Allow asks to make one call. If the circuit admits it, Allow returns a done
// function that must be called exactly once with the call's result (see the
// package documentation for how the error is classified); calls after the
// first are ignored, and a done whose call started before the circuit last
// changed state is ignored too. If the circuit rejects the call, Allow
// returns a nil done and an error wrapping ErrOpen.
//
// Allow is also what moves an open circuit to half-open once OpenFor has
// elapsed (as does State).
func (c *Circuit) Allow() (done func(err error), err error) {
	gdone, err := c.cb.Allow()
	c.notify()
	if err != nil {
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			return nil, c.errBusy
		}
		return nil, c.errOpen // gobreaker.ErrOpenState, its only other error
	}
	var finished atomic.Bool
	return func(err error) {
		if finished.Swap(true) {
			return
		}
		gdone(err)
		c.notify()
	}, nil
}

// State returns the circuit's current state. It is a lock-free atomic read,
// except once per open period: the first State call after OpenFor has elapsed
// asks gobreaker (taking its lock) so that the circuit reports half-open
// without waiting for the next Allow. The circuit stays open for OpenFor and
// is half-open from the first instant after that.
func (c *Circuit) State() State {
	s := State(c.state.Load())
	if s == Open && time.Since(c.epoch) > time.Duration(c.openUntil.Load()) {
		c.cb.State() // performs the lazy Open→HalfOpen; the hook updates c.state
		c.notify()
		s = State(c.state.Load())
	}
	return s
}

// Transitions returns how many times the circuit has changed state.
func (c *Circuit) Transitions() uint64 { return c.transitions.Load() }

// OnChange registers f to be told of every later state change, in order;
// a nil f unregisters. Register it before the circuit is used: changes made
// before registration are not reported.
//
// f runs synchronously, outside gobreaker's lock, on a goroutine that was
// calling Allow, done or State when the change happened (or on another such
// goroutine that is already delivering changes), so it delays that caller
// and should be quick. It may call back into the Circuit.
func (c *Circuit) OnChange(f func(from, to State)) {
	if f == nil {
		c.observer.Store(nil)
		return
	}
	c.observer.Store(&f)
}
