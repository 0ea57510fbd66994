package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/captchaai"
	"golang.org/x/time/rate"
)

// outcome is what one attempt produced.
type outcome struct {
	status     int              // HTTP status; 0 without a response
	ans        captchaai.Answer // the answer; Status StatusRaw for a non-protocol body
	err        error            // transport error (or oversized body); nil when a body was read
	retryAfter time.Duration    // Retry-After announced with the response
	verdict    verdict

	refused error             // the attempt was not made: circuit open, rate limited, paused, caller gone
	local   *captchaai.Answer // the attempt was not made: the key is now known bad
}

// protocol reports whether the attempt got a protocol answer CaptchaAI
// meant (not an HTTP-level failure).
func (o outcome) protocol() bool {
	return o.err == nil && o.ans.Status != captchaai.StatusRaw &&
		o.status < 500 && o.status != http.StatusTooManyRequests
}

// cause describes a failed attempt as an error.
func (o outcome) cause() error {
	switch {
	case o.err != nil:
		return o.err
	case o.status >= 500 || o.status == http.StatusTooManyRequests:
		return &statusError{code: o.status}
	case o.ans.Status == captchaai.StatusRaw:
		return fmt.Errorf("%w (%w)", captchaai.ErrNotProtocol, &statusError{code: o.status})
	case o.ans.Status == captchaai.StatusError:
		return &codeError{code: o.ans.Value}
	}
	return nil
}

// attempt makes attempt n of a call: checks the key again (for retries),
// waits for its turn, asks the circuit, exchanges with CaptchaAI, and
// reports the outcome to the circuit, the key table and Observe.
func (c *Client) attempt(ctx context.Context, r *captchaai.Request, k captchaai.Kind, ks *keyState, n int) outcome {
	if n > 1 && ks != nil {
		if local, err := c.keys.blocked(ks); local != nil || err != nil {
			return outcome{local: local, refused: err}
		}
	}
	if c.circuit.State() == breaker.Open {
		return outcome{refused: &refusal{kind: c.errOpen, after: defaultRetryAfter}}
	}
	release, err := c.waitTurn(ctx, ks)
	if err != nil {
		return outcome{refused: err}
	}
	defer release()
	done, err := c.circuit.Allow()
	if err != nil {
		return outcome{refused: &refusal{kind: err, after: defaultRetryAfter}}
	}

	c.Stats.Attempts.Add(1)
	if n == 1 {
		c.budget.deposit(time.Now())
	} else {
		c.Stats.Retries.Add(1)
	}
	start := time.Now()
	o := c.exchange(ctx, r, k)
	dur := time.Since(start)
	if o.refused != nil { // the request could not even be built
		done(nil)
		return o
	}
	o.verdict = classify(k, o.status, o.ans, o.err)
	v := o.verdict

	cause := o.cause()
	switch {
	case !v.Failure:
		done(nil)
	case o.err != nil && ctx.Err() != nil:
		done(breaker.Outcome(ctx, o.err)) // the caller gave up: excluded, not a failure
	default:
		c.Stats.Failures.Add(1)
		done(cause)
		c.log().Warn("upstream attempt failed", "endpoint", endpoint(r), "account", accountOf(ks),
			"attempt", n, "class", v.Label, "status", o.status, "err", cause)
	}

	if o.protocol() {
		c.noteContentType(o.ans)
		if ks != nil {
			nowBad, pause := c.keys.settle(ks, o.ans)
			if nowBad {
				c.log().Warn("upstream rejected API key; answering it locally", "account", ks.account,
					"code", o.ans.Value, "ttl", c.cfg.BadKeyTTL)
			}
			if pause > 0 {
				c.Stats.Pauses.Add(1)
				c.log().Warn("upstream throttled API key; pausing it", "account", ks.account,
					"code", o.ans.Value, "pause", pause)
			}
		}
	}

	if c.Observe != nil {
		a := Attempt{Kind: r.Kind, N: n, HTTPStatus: o.status, Class: v.Label, Dur: dur, Err: o.err}
		if o.ans.Status == captchaai.StatusError {
			a.Code = o.ans.Value
		}
		c.Observe(a)
	}
	return o
}

// waitTurn waits for the key's limiter, an in-flight slot and the global
// limiter, in that order (so that neither a slot nor a global token is held
// while waiting for a key's own limit), all within MaxWait and ctx. The
// returned release frees the slot.
func (c *Client) waitTurn(ctx context.Context, ks *keyState) (release func(), err error) {
	if c.lim == nil && c.sem == nil && (ks == nil || ks.lim == nil) {
		return func() {}, nil // nothing to wait for
	}
	wctx, cancel := context.WithTimeout(ctx, c.cfg.MaxWait)
	defer cancel()
	waited := false
	refuse := func(err error, after time.Duration) error {
		if waited {
			c.Stats.RateLimitWaits.Add(1)
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err() // the caller left
		}
		return &refusal{kind: ErrRateLimited, cause: err, after: max(after, minRetryAfter)}
	}
	if ks != nil && ks.lim != nil {
		w, after, err := waitLimiter(wctx, ks.lim)
		waited = waited || w
		if err != nil {
			return nil, refuse(err, after)
		}
	}
	if c.sem != nil {
		if !c.sem.TryAcquire(1) {
			waited = true
			if err := c.sem.Acquire(wctx, 1); err != nil {
				return nil, refuse(err, minRetryAfter)
			}
		}
		release = func() { c.sem.Release(1) }
	}
	if c.lim != nil {
		w, after, err := waitLimiter(wctx, c.lim)
		waited = waited || w
		if err != nil {
			if release != nil {
				release()
			}
			return nil, refuse(err, after)
		}
	}
	if waited {
		c.Stats.RateLimitWaits.Add(1)
	}
	if release == nil {
		release = func() {}
	}
	return release, nil
}

// errWaitTooLong: the limiter's next token comes after the wait deadline.
var errWaitTooLong = errors.New("upstream: next token is due after the wait deadline")

// waitLimiter takes one token from lim, waiting for it within ctx. A token
// due after ctx's deadline is not waited for. after is how long the wait
// would have been.
func waitLimiter(ctx context.Context, lim *rate.Limiter) (waited bool, after time.Duration, err error) {
	now := time.Now()
	res := lim.ReserveN(now, 1)
	if !res.OK() {
		return false, 0, errWaitTooLong
	}
	d := res.DelayFrom(now)
	if d <= 0 {
		return false, 0, nil
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		res.CancelAt(now)
		return true, d, errWaitTooLong
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true, d, nil
	case <-ctx.Done():
		res.Cancel()
		return true, d, ctx.Err()
	}
}

// exchange makes one HTTP exchange with CaptchaAI, bounded by
// Config.Timeout, and reads at most Config.MaxBody of the answer.
func (c *Client) exchange(ctx context.Context, r *captchaai.Request, k captchaai.Kind) outcome {
	actx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	req, err := r.Outgoing(actx, c.base)
	if err != nil {
		return outcome{refused: err}
	}
	if policyOf(k) == policySubmit {
		noReplay(req)
	}
	resp, err := c.rt.RoundTrip(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxBody+1))
	o := outcome{status: resp.StatusCode, retryAfter: parseRetryAfter(resp.Header, time.Now())}
	switch {
	case err != nil:
		o.err = err
		return o
	case int64(len(body)) > c.cfg.MaxBody:
		o.err = errBodyTooLarge
		return o
	}
	ans, err := captchaai.ParseAnswer(body)
	if err != nil {
		ans = captchaai.Answer{Status: captchaai.StatusRaw, Raw: body}
	}
	ans.HTTPStatus = resp.StatusCode
	ans.ContentType = resp.Header.Get("Content-Type")
	o.ans = ans
	return o
}

// noReplay makes an in.php request ineligible for net/http's own silent
// resends. The Transport resends a GET, HEAD, OPTIONS or TRACE request
// (and any request carrying Idempotency-Key or X-Idempotency-Key) when a
// reused keep-alive connection dies after the request was written and before
// a response: for in.php that resend could create a second task. Such a
// request gets a body without GetBody (an empty one if it had none, which
// the Transport probes, finds empty and does not send), and the idempotency
// headers are dropped. Resends of requests never written are unaffected for
// POST; for the other methods they are lost, which is safe.
func noReplay(req *http.Request) {
	req.Header.Del("Idempotency-Key")
	req.Header.Del("X-Idempotency-Key")
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "":
		if req.Body == nil || req.Body == http.NoBody {
			req.Body = io.NopCloser(emptyReader{})
		}
		req.GetBody = nil
	}
}

// emptyReader is an empty body that cannot be rewound (see noReplay).
type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, io.EOF }
