// Package upstream talks to CaptchaAI safely: it retries only what cannot
// make a user pay twice, stops calling a failing CaptchaAI (circuit
// breaker), keeps within rate, per-key and concurrency limits, and answers
// bad API keys locally so one misconfigured worker cannot get the shared
// egress IP banned.
//
// A Client has three entry points, one per retry policy (see classify in
// retry.go for the single table behind them):
//
//   - Submit (in.php) retries only what provably created no task: a
//     connection that was never made, HTTP 429, capacity codes such as
//     ERROR_NO_SLOT_AVAILABLE. A submission that was sent and got no
//     answer (timeout, reset, HTTP 5xx, ERROR_SERVER_ERROR) is never
//     resent; it fails with ErrAmbiguous.
//   - Result (res.php get, ids=, getbalance) is idempotent and retries
//     every transient failure.
//   - Forward (reports, unknown actions, solve.php) retries only a
//     connection that was never made and hands non-protocol bodies back
//     untouched.
//
// Every attempt (first or retry) waits its turn in this order, all within
// Config.MaxWait and the caller's deadline: the key's own rate limit, an
// in-flight slot, the global rate limit; then the circuit admits it or
// not. Retries wait a full-jitter exponential backoff, never past the
// caller's deadline, and draw on a retry budget (at most Config.RetryBudget
// retries per call over a rolling window) so an outage cannot multiply
// load.
//
// When the Client refuses or gives up for CaptchaAI's sake it returns an
// error that FailFast recognises; the proxy answers those with the
// protocol's "retry later" (ERROR_NO_SLOT_AVAILABLE for in.php,
// CAPCHA_NOT_READY for a task still being solved) and Retry-After, never an
// HTTP 5xx.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/captchaai"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// Client calls CaptchaAI on behalf of solveonce's clients. It is safe for
// concurrent use; create it with New and do not copy it.
type Client struct {
	// Stats counts requests, attempts, retries, waits and refusals.
	Stats Stats
	// Observe, if set, is told of every finished attempt. It runs on the
	// calling goroutine and must not block. Set it before first use.
	Observe func(Attempt)
	// Logger receives circuit transitions (Info) and upstream failures,
	// bad keys and pauses (Warn), naming accounts by their hash, never by
	// key. nil means slog.Default(). Set it before first use.
	Logger *slog.Logger

	cfg     Config
	base    *url.URL
	rt      http.RoundTripper
	circuit *breaker.Circuit
	errOpen error               // wraps breaker.ErrOpen, for refusals seen before Allow
	lim     *rate.Limiter       // global limit; nil when unlimited
	sem     *semaphore.Weighted // in-flight cap; nil when unlimited
	keys    *keys
	budget  *budget
	rnd     func(n int64) int64 // uniform in [0, n): the jitter source

	contentType [2]atomic.Pointer[string] // last Content-Type CaptchaAI used, per captchaai.Format
}

// New builds a Client from cfg (zero fields take their defaults; the result
// is validated). c is the circuit for this upstream; nil builds one with
// breaker defaults and IsFailure. New registers the Client as c's OnChange
// observer, to log transitions and count openings: register no other.
// rt is the transport; nil means NewTransport(cfg.MaxInFlight).
func New(cfg Config, c *breaker.Circuit, rt http.RoundTripper) (*Client, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, err := parseBaseURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if rt == nil {
		rt = NewTransport(cfg.MaxInFlight)
	}
	if c == nil {
		c = breaker.New("captchaai", breaker.Config{}, IsFailure)
	}
	cl := &Client{
		cfg:     cfg,
		base:    base,
		rt:      rt,
		circuit: c,
		errOpen: fmt.Errorf("%w: %q is open", breaker.ErrOpen, c.Name()),
		keys:    newKeys(cfg),
		budget:  newBudget(cfg.RetryBudget, cfg.RetryReserve),
		rnd:     rand.Int64N,
	}
	if cfg.Rate > 0 {
		cl.lim = rate.NewLimiter(limit(cfg.Rate), cfg.Burst)
	}
	if cfg.MaxInFlight > 0 {
		cl.sem = semaphore.NewWeighted(cfg.MaxInFlight)
	}
	c.OnChange(cl.circuitChanged)
	return cl, nil
}

// Circuit returns the client's circuit breaker (for metrics and health).
func (c *Client) Circuit() *breaker.Circuit { return c.circuit }

// Config returns the configuration in effect, defaults applied.
func (c *Client) Config() Config { return c.cfg }

func (c *Client) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

func (c *Client) circuitChanged(from, to breaker.State) {
	if to == breaker.Open {
		c.Stats.BreakerOpens.Add(1)
	}
	c.log().Info("upstream circuit changed state", "circuit", c.circuit.Name(), "from", from.String(), "to", to.String())
}

// Submit sends an in.php submission. It retries only what provably created
// no task (a connection never made, HTTP 429, capacity codes such as
// ERROR_NO_SLOT_AVAILABLE); when those run out it returns CaptchaAI's last
// protocol answer, or ErrUnavailable. A submission sent without a usable
// answer fails with ErrAmbiguous and is not resent. A non-protocol body
// with a 3xx/4xx status (CaptchaAI's front rejected the request) comes
// back as a StatusRaw answer. Protocol answers, error codes included,
// come back with a nil error and the format the client asked for.
func (c *Client) Submit(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error) {
	return c.call(ctx, r, captchaai.KindSubmit)
}

// Result sends an idempotent res.php request (action=get with id or ids,
// getbalance) and retries transient failures: transport errors, timeouts,
// HTTP 5xx and 429, non-protocol bodies, server and capacity codes. When
// they run out it fails with ErrUnavailable (the task is still alive: the
// proxy answers CAPCHA_NOT_READY). An in.php request given to Result is
// handled as by Submit; any other kind as by Forward.
func (c *Client) Result(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error) {
	k := r.Kind
	if policyOf(k) == policyOther {
		k = captchaai.KindOther
	}
	return c.call(ctx, r, k)
}

// Forward sends any other request (reports, unknown res.php actions,
// solve.php, unparsed requests) unchanged, retrying only a connection that
// was never made. A body that is no protocol answer comes back as a
// StatusRaw answer with its status and Content-Type, never as an error,
// unless the status is 5xx (ErrUnavailable: no 5xx reaches clients). An
// in.php request given to Forward is handled as by Submit.
func (c *Client) Forward(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error) {
	k := captchaai.KindOther
	if r.Kind == captchaai.KindSubmit {
		k = captchaai.KindSubmit
	}
	return c.call(ctx, r, k)
}

// call runs one client request: key admission, then attempts until an
// answer, a refusal or a verdict that forbids retrying.
func (c *Client) call(ctx context.Context, r *captchaai.Request, k captchaai.Kind) (captchaai.Answer, error) {
	c.Stats.Requests.Add(1)
	// A request solveonce could not parse may carry its key where the
	// parser did not find it: it is neither vetted nor remembered, so it
	// can never be mistaken for (or blamed on) another key.
	var ad admission
	if r.Understood {
		ad = c.keys.admit(ctx, r.Key(), c.cfg.MaxWait)
		defer c.keys.release(ad)
	}
	switch {
	case ad.local != nil:
		c.Stats.BadKeyLocal.Add(1)
		return localAnswer(*ad.local, r.Format, c.lastContentType(r.Format)), nil
	case ad.err != nil:
		c.countRefusal(ad.err)
		return captchaai.Answer{}, wrapf(r, 0, ad.err)
	}

	for n := 1; ; n++ {
		o := c.attempt(ctx, r, k, ad.ks, n)
		if o.refused != nil {
			c.countRefusal(o.refused)
			return captchaai.Answer{}, wrapf(r, n-1, o.refused)
		}
		if o.local != nil { // the key went bad or got paused between attempts
			c.Stats.BadKeyLocal.Add(1)
			return localAnswer(*o.local, r.Format, c.lastContentType(r.Format)), nil
		}
		v := o.verdict
		if !v.Retry || ctx.Err() != nil {
			return c.finish(ctx, r, k, ad.ks, n, o)
		}
		if n >= c.cfg.MaxAttempts {
			return c.finish(ctx, r, k, ad.ks, n, o)
		}
		wait := backoff(n, c.cfg.BackoffBase, c.cfg.BackoffCap, c.rnd)
		if o.retryAfter > c.cfg.BackoffCap {
			return c.finish(ctx, r, k, ad.ks, n, o) // CaptchaAI asks for a longer pause than a request should wait
		}
		wait = max(wait, o.retryAfter)
		if dl, ok := ctx.Deadline(); ok && !time.Now().Add(wait).Before(dl) {
			return c.finish(ctx, r, k, ad.ks, n, o)
		}
		if !c.budget.withdraw(time.Now()) {
			c.Stats.RetriesDenied.Add(1)
			return c.finish(ctx, r, k, ad.ks, n, o)
		}
		if err := sleep(ctx, wait); err != nil {
			return c.finish(ctx, r, k, ad.ks, n, o)
		}
	}
}

// finish turns the last attempt's outcome into the call's result.
func (c *Client) finish(ctx context.Context, r *captchaai.Request, k captchaai.Kind, ks *keyState, n int, o outcome) (captchaai.Answer, error) {
	v := o.verdict
	cause := o.cause()
	switch {
	case v.Ambiguous:
		c.Stats.Ambiguous.Add(1)
		c.log().Warn("upstream in.php outcome unknown; not resent", "account", accountOf(ks), "attempts", n, "class", v.Label, "err", cause)
		return captchaai.Answer{}, wrapf(r, n, &refusal{kind: ErrAmbiguous, cause: cause, after: defaultRetryAfter})
	case o.err != nil && errors.Is(ctx.Err(), context.Canceled):
		return captchaai.Answer{}, wrapf(r, n, cause) // the caller left; nobody to answer
	case v.Raw:
		return o.ans, nil
	case o.protocol() && !(v.Retry && policyOf(k) == policyIdempotent):
		return o.ans, nil
	}
	return captchaai.Answer{}, wrapf(r, n, &refusal{kind: ErrUnavailable, cause: cause, after: defaultRetryAfter})
}

func (c *Client) countRefusal(err error) {
	switch {
	case errors.Is(err, breaker.ErrOpen):
		c.Stats.BreakerRejects.Add(1)
	case errors.Is(err, ErrRateLimited):
		c.Stats.RateLimitRejects.Add(1)
	case errors.Is(err, ErrPaused):
		c.Stats.Paused.Add(1)
	}
}

func (c *Client) lastContentType(f captchaai.Format) string {
	if p := c.contentType[f&1].Load(); p != nil {
		return *p
	}
	return ""
}

func (c *Client) noteContentType(a captchaai.Answer) {
	if a.ContentType == "" {
		return
	}
	p := &c.contentType[a.Format&1]
	if old := p.Load(); old == nil || *old != a.ContentType {
		ct := a.ContentType
		p.Store(&ct)
	}
}

func accountOf(ks *keyState) string {
	if ks == nil {
		return ""
	}
	return ks.account
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
