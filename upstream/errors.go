package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/captchaai"
)

// Errors the Client returns when it refuses or gives up for CaptchaAI's
// sake. Test for them with errors.Is; FailFast recognises all of them (and
// breaker.ErrOpen) and says how long a client should wait.
var (
	// ErrRateLimited: the request did not get its turn (rate limits,
	// in-flight cap, a new key's first answer) within Config.MaxWait or the
	// caller's deadline. Nothing was sent.
	ErrRateLimited = errors.New("upstream: rate limit wait exceeded")
	// ErrPaused: CaptchaAI announced a pause for this key (MAX_USER_TURN,
	// ERROR: 100x) and it has not ended. Nothing was sent.
	ErrPaused = errors.New("upstream: key paused after a throttle answer")
	// ErrAmbiguous: an in.php submission was sent but no answer came back
	// that says whether CaptchaAI created the task (timeout, reset, HTTP
	// 5xx, a server-fault code). It is never retried, because a resend
	// could pay twice; the error wraps the cause.
	ErrAmbiguous = errors.New("upstream: in.php outcome unknown (sent, no answer)")
	// ErrUnavailable: CaptchaAI kept failing transiently (transport errors,
	// HTTP 5xx or 429, non-protocol bodies, capacity or server codes) until
	// the attempts, the retry budget or the caller's deadline ran out. The
	// error wraps the last cause.
	ErrUnavailable = errors.New("upstream: CaptchaAI unavailable")
)

// Suggested waits for clients refused for upstream's sake.
const (
	minRetryAfter     = time.Second
	defaultRetryAfter = 5 * time.Second // CaptchaAI: "retry in 5 s" for capacity and server errors
)

// FailFast reports whether err means solveonce refused or gave up for
// CaptchaAI's sake (circuit open, rate limited, key paused, ambiguous
// submission, transient failures exhausted), so that the caller should get
// the protocol's "retry later" answer instead of an error; retryAfter is
// how long that client should wait (at least 1s), for Retry-After.
//
// A bare caller cancellation is not fail-fast: nobody is left to answer.
// The Client's fail-fast errors also have a method RetryAfter() time.Duration
// giving the same wait, for callers that match it with errors.As without
// importing this package.
func FailFast(err error) (retryAfter time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	var r *refusal
	if errors.As(err, &r) {
		return r.RetryAfter(), true
	}
	for _, target := range []error{breaker.ErrOpen, ErrRateLimited, ErrPaused, ErrAmbiguous, ErrUnavailable} {
		if errors.Is(err, target) {
			return defaultRetryAfter, true
		}
	}
	return 0, false
}

// refusal is a fail-fast error: a sentinel (or the circuit's error), an
// optional detail and cause, and a suggested wait.
type refusal struct {
	kind   error  // ErrRateLimited, ErrPaused, ErrAmbiguous, ErrUnavailable or a breaker error
	detail string // e.g. the throttle code; may be empty
	cause  error  // may be nil
	after  time.Duration
}

func (e *refusal) Error() string {
	s := e.kind.Error()
	if e.detail != "" {
		s += " (" + e.detail + ")"
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

// RetryAfter is the suggested wait, at least 1s. Packages that must not
// import upstream (proxy) find it with errors.As on an interface
// { RetryAfter() time.Duration }.
func (e *refusal) RetryAfter() time.Duration { return max(minRetryAfter, e.after) }

func (e *refusal) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// DialError means the connection to CaptchaAI could not be made: nothing
// of the request reached CaptchaAI, so even an in.php submission can be
// retried. The default transport wraps its dialer's failures in it.
type DialError struct{ Err error }

func (e *DialError) Error() string { return "upstream: dial: " + e.Err.Error() }

// Unwrap returns the dialer's error.
func (e *DialError) Unwrap() error { return e.Err }

// notSent reports whether err proves that nothing of the request reached
// CaptchaAI: a DialError, a dial-stage *net.OpError (as net.Dialer returns
// and http.Transport passes through), or a refused connection (refusal only
// happens while connecting).
func notSent(err error) bool {
	if err == nil {
		return false
	}
	var de *DialError
	if errors.As(err, &de) {
		return true
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// statusError is an HTTP error status from CaptchaAI (5xx, 429, or another
// status whose body is no protocol answer).
type statusError struct {
	code int
}

func (e *statusError) Error() string {
	return "upstream: HTTP " + strconv.Itoa(e.code) + " " + http.StatusText(e.code)
}

// codeError is a protocol error code that counts as a failure (a
// server-fault code such as ERROR_SERVER_ERROR).
type codeError struct{ code string }

func (e *codeError) Error() string { return "upstream: answered " + e.code }

// errBodyTooLarge: the response exceeded Config.MaxBody.
var errBodyTooLarge = errors.New("upstream: response body exceeds max_body")

// IsFailure reports whether err, the outcome of one call to CaptchaAI, means
// CaptchaAI is failing: a transport error (including solveonce's own
// per-attempt timeout), an HTTP 5xx, a body that is no protocol answer, a
// server-fault code. Account, request, capacity and terminal answers are
// not failures. It is the classification a Client reports to its circuit;
// pass it to breaker.New when building a circuit for a Client. (A Client
// hands done nil for every outcome that is not a failure, and a caller's
// cancellation marked by breaker.Outcome, which the circuit excludes; so a
// nil isFailure gives the same verdicts.)
func IsFailure(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var se *statusError
	if errors.As(err, &se) {
		return se.code != http.StatusTooManyRequests
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return captchaai.Classify(ce.code) == captchaai.ClassServer
	}
	// Transport errors, timeouts, non-protocol bodies, oversized bodies.
	return true
}

// wrapf annotates err with the endpoint and, once attempts were made,
// their number.
func wrapf(r *captchaai.Request, attempts int, err error) error {
	if attempts == 0 {
		return fmt.Errorf("%s: %w", endpoint(r), err)
	}
	return fmt.Errorf("%s: giving up after %d attempt(s): %w", endpoint(r), attempts, err)
}

func endpoint(r *captchaai.Request) string {
	if r.Kind == captchaai.KindOther {
		return r.Path
	}
	return r.Kind.Endpoint()
}
