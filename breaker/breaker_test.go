package breaker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

var (
	errUpstream = errors.New("captchaai: 502 bad gateway")
	errBenign   = errors.New("captchaai: ERROR_ZERO_BALANCE") // an account error: not CaptchaAI failing
)

func isFailure(err error) bool { return !errors.Is(err, errBenign) }

// result is what an admitted call reports to done.
type result int

const (
	ok             result = iota // nil
	fail                         // upstream failure
	benign                       // error for which isFailure is false
	canceled                     // bare context.Canceled: always excluded
	callerDeadline               // Outcome(expired caller ctx, DeadlineExceeded): excluded
	ownDeadline                  // Outcome(live caller ctx, DeadlineExceeded): our timeout, a failure
)

func (r result) err() error {
	switch r {
	case fail:
		return fmt.Errorf("solve: %w", errUpstream)
	case benign:
		return fmt.Errorf("solve: %w", errBenign)
	case canceled:
		return fmt.Errorf("solve: %w", context.Canceled)
	case callerDeadline:
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		return Outcome(ctx, fmt.Errorf("solve: %w", context.DeadlineExceeded))
	case ownDeadline:
		return Outcome(context.Background(), fmt.Errorf("solve: %w", context.DeadlineExceeded))
	default:
		return nil
	}
}

type action int

const (
	doCall    action = iota // Allow, then done(res) at once
	doReject                // Allow, which must be rejected
	doHold                  // Allow, keeping done for a later doRelease
	doRelease               // finish the oldest held call with res
	doSleep                 // advance the bubble's fake clock by d
)

// step is one row of a state-machine table. After the step the circuit's
// State() must be want.
type step struct {
	do   action
	res  result
	d    time.Duration
	want State
}

func call(r result, want State) step         { return step{do: doCall, res: r, want: want} }
func reject(want State) step                 { return step{do: doReject, want: want} }
func hold(want State) step                   { return step{do: doHold, want: want} }
func release(r result, want State) step      { return step{do: doRelease, res: r, want: want} }
func sleep(d time.Duration, want State) step { return step{do: doSleep, d: d, want: want} }

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func steps(groups ...[]step) []step {
	var out []step
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

func one(s ...step) []step { return s }

// base trips on 3 failures in a row, or on >= 50% failures once 4 calls
// finished in a 10s window; it stays open 5s and admits 1 probe.
var base = Config{MinRequests: 4, FailureRatio: 0.5, ConsecutiveFailures: 3, Window: 10 * time.Second, OpenFor: 5 * time.Second, Probes: 1}

const openFor = 5 * time.Second

// tripped drives a base-like circuit (ConsecutiveFailures 3) open.
var tripped = one(call(fail, Closed), call(fail, Closed), call(fail, Open))

func with(f func(*Config)) Config { c := base; f(&c); return c }

func TestStateMachine(t *testing.T) {
	noRun := with(func(c *Config) { c.ConsecutiveFailures = 100 })
	tests := []struct {
		name    string
		cfg     Config
		steps   []step
		changes []string
	}{
		{
			name:  "below MinRequests no verdict",
			cfg:   noRun,
			steps: one(call(fail, Closed), call(ok, Closed), call(fail, Closed)), // 2/3 failed, but only 3 finished
		},
		{
			name: "ratio trips once MinRequests finished",
			cfg:  noRun,
			steps: one(call(fail, Closed), call(ok, Closed), call(fail, Closed), call(ok, Closed),
				call(fail, Open)), // 3/5 >= 0.5
			changes: []string{"closed->open"},
		},
		{
			name: "ratio below FailureRatio stays closed",
			cfg:  noRun,
			steps: steps(repeat(6, call(ok, Closed)),
				one(call(fail, Closed), call(fail, Closed), call(fail, Closed), call(fail, Closed), call(fail, Closed)), // 5/11
				one(call(fail, Open))), // 6/12
			changes: []string{"closed->open"},
		},
		{
			name:    "run of ConsecutiveFailures trips regardless of ratio and MinRequests",
			cfg:     with(func(c *Config) { c.MinRequests = 100 }),
			steps:   steps(repeat(20, call(ok, Closed)), one(call(fail, Closed), call(fail, Closed), call(fail, Open))),
			changes: []string{"closed->open"},
		},
		{
			name:  "a success breaks the run",
			cfg:   with(func(c *Config) { c.MinRequests = 100 }),
			steps: one(call(fail, Closed), call(fail, Closed), call(ok, Closed), call(fail, Closed), call(fail, Closed)),
		},
		{
			name:  "non-failures never trip",
			cfg:   base,
			steps: steps(repeat(50, call(benign, Closed)), one(call(fail, Closed), call(fail, Closed))), // run 2, ratio 2/52
		},
		{
			// Were benign errors excluded, the 4th failure would trip at 4/4.
			name: "benign errors count as successes",
			cfg:  noRun,
			steps: steps(repeat(6, call(benign, Closed)),
				repeat(5, call(fail, Closed)), // 5/11
				one(call(fail, Open))),        // 6/12
			changes: []string{"closed->open"},
		},
		{
			// If exclusions counted as successes, 3 fails of 7 would stay closed.
			name: "excluded errors are not counted",
			cfg:  noRun,
			steps: steps(
				one(call(fail, Closed)),
				repeat(5, call(canceled, Closed)),
				repeat(5, call(callerDeadline, Closed)),
				one(call(fail, Closed), call(ok, Closed)), // 3 finished < MinRequests
				one(call(fail, Open)),                     // 3/4
			),
			changes: []string{"closed->open"},
		},
		{
			name:    "excluded errors do not break a run",
			cfg:     with(func(c *Config) { c.MinRequests = 100 }),
			steps:   one(call(fail, Closed), call(canceled, Closed), call(fail, Closed), call(callerDeadline, Closed), call(fail, Open)),
			changes: []string{"closed->open"},
		},
		{
			name:    "own deadline (caller still waiting) is a failure",
			cfg:     base,
			steps:   one(call(ownDeadline, Closed), call(ownDeadline, Closed), call(ownDeadline, Open)),
			changes: []string{"closed->open"},
		},
		{
			name: "open rejects; half-open after OpenFor via State alone; probe success closes",
			cfg:  base,
			steps: steps(tripped,
				one(reject(Open), reject(Open)),
				one(sleep(openFor-time.Second, Open), reject(Open)),
				one(sleep(time.Second, Open)),         // exactly OpenFor: still open
				one(sleep(time.Nanosecond, HalfOpen)), // State() alone moves it, no Allow
				one(hold(HalfOpen)),                   // the one probe
				one(reject(HalfOpen), reject(HalfOpen)),
				one(release(ok, Closed)),
				one(call(fail, Closed), call(ok, Closed)), // counts were reset on closing
			),
			changes: []string{"closed->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "probe failure reopens for another OpenFor",
			cfg:  base,
			steps: steps(tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen), hold(HalfOpen), reject(HalfOpen)),
				one(release(fail, Open), reject(Open)),
				one(sleep(openFor, Open), reject(Open)),
				one(sleep(time.Millisecond, HalfOpen), call(ok, Closed)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "Probes=2 admits exactly two and needs both to succeed",
			cfg:  with(func(c *Config) { c.Probes = 2 }),
			steps: steps(tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen)),
				one(hold(HalfOpen), hold(HalfOpen), reject(HalfOpen)),
				one(release(ok, HalfOpen), reject(HalfOpen)),
				one(release(ok, Closed)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "Probes=2 one failure reopens",
			cfg:  with(func(c *Config) { c.Probes = 2 }),
			steps: steps(tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen), hold(HalfOpen), hold(HalfOpen)),
				one(release(ok, HalfOpen), release(fail, Open)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->open"},
		},
		{
			name: "benign probe error closes",
			cfg:  base,
			steps: steps(tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen), call(benign, Closed)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "excluded probe frees its slot without a verdict",
			cfg:  base,
			steps: steps(tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen), hold(HalfOpen), reject(HalfOpen)),
				one(release(canceled, HalfOpen)),
				one(hold(HalfOpen), reject(HalfOpen), release(callerDeadline, HalfOpen)),
				one(call(ok, Closed)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "result of a call admitted before the trip is ignored",
			cfg:  base,
			steps: steps(
				one(hold(Closed)),
				tripped,
				one(sleep(openFor+time.Millisecond, HalfOpen)),
				one(release(fail, HalfOpen)), // stale: not a probe failure
				one(call(ok, Closed)),
			),
			changes: []string{"closed->open", "open->half-open", "half-open->closed"},
		},
		{
			name: "rolling window forgets results older than Window",
			cfg:  noRun,
			steps: steps(
				one(call(fail, Closed), call(fail, Closed)),
				one(sleep(11*time.Second, Closed)),
				one(call(ok, Closed), call(ok, Closed), call(fail, Closed), call(ok, Closed)), // 1/4 in window
				one(call(fail, Closed)),                                                       // 2/5
			),
		},
		{
			name: "rolling window keeps results within Window",
			cfg:  noRun,
			steps: steps(
				one(call(fail, Closed), call(fail, Closed)),
				one(sleep(5*time.Second, Closed)),
				one(call(ok, Closed), call(fail, Open)), // 3/4 in window
			),
			changes: []string{"closed->open"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := New("captchaai", tt.cfg, isFailure)
				var seen []string
				c.OnChange(func(from, to State) {
					seen = append(seen, from.String()+"->"+to.String())
					_ = c.State() // re-entering the circuit from the observer must not deadlock
				})
				var held []func(error)
				for i, s := range tt.steps {
					switch s.do {
					case doCall, doHold:
						done, err := c.Allow()
						if err != nil {
							t.Fatalf("step %d: Allow() rejected: %v", i, err)
						}
						if s.do == doCall {
							done(s.res.err())
						} else {
							held = append(held, done)
						}
					case doReject:
						done, err := c.Allow()
						if err == nil {
							done(nil)
							t.Fatalf("step %d: Allow() admitted, want rejection", i)
						}
						if !errors.Is(err, ErrOpen) || done != nil {
							t.Fatalf("step %d: Allow() = (%v, %v), want (nil, error wrapping ErrOpen)", i, done != nil, err)
						}
					case doRelease:
						held[0](s.res.err())
						held = held[1:]
					case doSleep:
						time.Sleep(s.d)
					}
					if got := c.State(); got != s.want {
						t.Fatalf("step %d (%+v): State() = %v, want %v", i, s, got, s.want)
					}
					if got := c.Transitions(); got != uint64(len(seen)) {
						t.Fatalf("step %d: Transitions() = %d, observer saw %d changes %v", i, got, len(seen), seen)
					}
				}
				if strings.Join(seen, ",") != strings.Join(tt.changes, ",") {
					t.Errorf("changes = %v, want %v", seen, tt.changes)
				}
			})
		})
	}
}

// TestAllowMovesToHalfOpen checks that Allow alone (no State call) performs
// the lazy Open→HalfOpen transition, reports it, and admits the probe.
func TestAllowMovesToHalfOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New("captchaai", base, isFailure)
		var seen []string
		c.OnChange(func(from, to State) { seen = append(seen, from.String()+"->"+to.String()) })
		for range 3 {
			done, err := c.Allow()
			if err != nil {
				t.Fatal(err)
			}
			done(errUpstream)
		}
		time.Sleep(openFor + time.Millisecond)
		if n := c.Transitions(); n != 1 {
			t.Fatalf("Transitions() = %d before Allow, want 1 (transition is lazy)", n)
		}
		done, err := c.Allow()
		if err != nil {
			t.Fatalf("probe rejected: %v", err)
		}
		if want := "closed->open,open->half-open"; strings.Join(seen, ",") != want {
			t.Fatalf("changes = %v, want %s", seen, want)
		}
		if s := c.State(); s != HalfOpen {
			t.Fatalf("State() = %v, want half-open", s)
		}
		done(nil)
		done(errUpstream) // a second done is ignored
		if s := c.State(); s != Closed {
			t.Fatalf("State() = %v, want closed", s)
		}
		if n := c.Transitions(); n != 3 {
			t.Fatalf("Transitions() = %d, want 3", n)
		}
	})
}

func TestRejectionErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New("captchaai", base, nil) // nil isFailure: every error is a failure
		for range 3 {
			done, err := c.Allow()
			if err != nil {
				t.Fatal(err)
			}
			done(errBenign)
		}
		_, err := c.Allow()
		if !errors.Is(err, ErrOpen) || errors.Is(err, gobreaker.ErrOpenState) || !strings.Contains(err.Error(), `"captchaai"`) {
			t.Fatalf("open rejection = %v", err)
		}
		time.Sleep(openFor + time.Millisecond)
		done, err := c.Allow()
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Allow()
		if !errors.Is(err, ErrOpen) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			t.Fatalf("half-open rejection = %v", err)
		}
		done(nil)
		if c.Name() != "captchaai" {
			t.Fatalf("Name() = %q", c.Name())
		}
	})
}

// TestConcurrent hammers one circuit from many goroutines; run with -race.
// It also checks the observer sees every change exactly once and in order.
func TestConcurrent(t *testing.T) {
	c := New("captchaai", Config{
		MinRequests: 4, FailureRatio: 0.5, ConsecutiveFailures: 3,
		Window: 10 * time.Millisecond, OpenFor: 200 * time.Microsecond, Probes: 2,
	}, isFailure)
	var (
		calls atomic.Int64
		last  = Closed
		bad   atomic.Int64
	)
	c.OnChange(func(from, to State) {
		if from != last || from == to {
			bad.Add(1)
		}
		last = to
		calls.Add(1)
		_ = c.State()
	})

	const workers, iters = 32, 2000
	var wg, async sync.WaitGroup
	var admitted, rejected atomic.Int64
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range iters {
				_ = c.State()
				_ = c.Transitions()
				done, err := c.Allow()
				if err != nil {
					if !errors.Is(err, ErrOpen) {
						t.Errorf("Allow: %v", err)
						return
					}
					rejected.Add(1)
					time.Sleep(10 * time.Microsecond)
					continue
				}
				admitted.Add(1)
				r := result(rng.IntN(6))
				if rng.IntN(2) == 0 { // sometimes let other calls overlap
					async.Go(func() { done(r.err()); done(r.err()) })
				} else {
					done(r.err())
				}
			}
		})
	}
	wg.Wait()
	async.Wait()
	// Every change was delivered before the call that caused it returned
	// (or by the goroutine already delivering, before it stopped).
	if got, want := uint64(calls.Load()), c.Transitions(); got != want {
		t.Errorf("observer called %d times, Transitions() = %d", got, want)
	}
	if bad.Load() != 0 {
		t.Errorf("observer saw %d out-of-order changes", bad.Load())
	}
	if c.Transitions() == 0 || rejected.Load() == 0 {
		t.Errorf("workload never tripped: transitions=%d admitted=%d rejected=%d", c.Transitions(), admitted.Load(), rejected.Load())
	}
	t.Logf("transitions=%d admitted=%d rejected=%d", c.Transitions(), admitted.Load(), rejected.Load())
}

// TestObserverMayCallBack checks that the observer runs outside gobreaker's
// lock: calling Allow (which always takes that lock) from it must not deadlock.
func TestObserverMayCallBack(t *testing.T) {
	c := New("captchaai", Config{ConsecutiveFailures: 1, OpenFor: time.Millisecond}, isFailure)
	var seen atomic.Int64
	c.OnChange(func(from, to State) {
		seen.Add(1)
		if done, err := c.Allow(); err == nil {
			done(context.Canceled) // excluded: no effect on the state
		}
	})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done, _ := c.Allow()
		done(errUpstream) // closed->open
		time.Sleep(2 * time.Millisecond)
		_ = c.State() // open->half-open
		done, err := c.Allow()
		if err != nil {
			t.Errorf("probe rejected: %v", err)
			return
		}
		done(nil) // half-open->closed
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock: observer calling back into the Circuit")
	}
	if seen.Load() != 3 || c.Transitions() != 3 || c.State() != Closed {
		t.Fatalf("seen=%d transitions=%d state=%v, want 3, 3, closed", seen.Load(), c.Transitions(), c.State())
	}
}

func TestOutcome(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	wrappedDeadline := fmt.Errorf("post: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		err      error
		excluded bool
	}{
		{"nil", ended, nil, false},
		{"live ctx deadline is ours", live, wrappedDeadline, false},
		{"ended ctx deadline", ended, wrappedDeadline, true},
		{"ended ctx canceled", ended, context.Canceled, true},
		{"ended ctx, upstream error", ended, errUpstream, false},
		{"bare canceled is excluded anyway", live, context.Canceled, true},
	} {
		got := Outcome(tc.ctx, tc.err)
		if excluded(got) != tc.excluded {
			t.Errorf("%s: excluded(Outcome) = %v, want %v", tc.name, excluded(got), tc.excluded)
		}
		if tc.err != nil && (!errors.Is(got, tc.err) || got.Error() != tc.err.Error()) {
			t.Errorf("%s: Outcome lost the error chain: %v", tc.name, got)
		}
		if tc.err == nil && got != nil {
			t.Errorf("%s: Outcome(nil) = %v", tc.name, got)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	got := Config{FailureRatio: -1, Window: -time.Second}.WithDefaults()
	want := Config{MinRequests: 10, FailureRatio: 0.5, ConsecutiveFailures: 5, Window: 30 * time.Second, OpenFor: 15 * time.Second, Probes: 1}
	if got != want {
		t.Errorf("WithDefaults() = %+v, want %+v", got, want)
	}
	set := Config{MinRequests: 1, FailureRatio: 0.9, ConsecutiveFailures: 2, Window: time.Minute, OpenFor: time.Second, Probes: 3}
	if got := set.WithDefaults(); got != set {
		t.Errorf("WithDefaults() changed set fields: %+v", got)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", HalfOpen: "half-open", Open: "open", State(7): "state(7)"} {
		if got := s.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int32(s), got, want)
		}
	}
}
