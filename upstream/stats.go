package upstream

import (
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/captchaai"
)

// Stats counts what a Client did. The fields are updated atomically on the
// hot path and meant to be read at scrape time (e.g. by CounterFuncs).
type Stats struct {
	// Requests is calls to Submit, Result and Forward.
	Requests atomic.Int64
	// Attempts is HTTP exchanges started with CaptchaAI (first tries and
	// retries).
	Attempts atomic.Int64
	// Retries is attempts after the first (counted in Attempts too).
	Retries atomic.Int64
	// RetriesDenied is retries the retry budget refused.
	RetriesDenied atomic.Int64
	// RateLimitWaits is attempts that had to wait for a rate limit or an
	// in-flight slot; RateLimitRejects is those refused with ErrRateLimited.
	RateLimitWaits   atomic.Int64
	RateLimitRejects atomic.Int64
	// BreakerRejects is attempts refused because the circuit was open (or
	// half-open with its probes out); BreakerOpens is how often it opened.
	BreakerRejects atomic.Int64
	BreakerOpens   atomic.Int64
	// BadKeyLocal is calls answered locally for a key CaptchaAI rejected.
	BadKeyLocal atomic.Int64
	// Paused is calls refused with ErrPaused; Pauses is throttle answers
	// that paused a key.
	Paused atomic.Int64
	Pauses atomic.Int64
	// Ambiguous is in.php submissions whose outcome is unknown.
	Ambiguous atomic.Int64
	// Failures is attempts the circuit counted as CaptchaAI failing.
	Failures atomic.Int64
}

// Attempt describes one finished HTTP exchange with CaptchaAI, for
// Client.Observe (metrics, tracing).
type Attempt struct {
	// Kind is the kind of the request the attempt belongs to.
	Kind captchaai.Kind
	// N is the attempt number within its call, from 1.
	N int
	// HTTPStatus is the response status; 0 if there was no response.
	HTTPStatus int
	// Code is the protocol error code, "" for other answers.
	Code string
	// Class labels the outcome: "ok", "not_ready", "empty", an error-code
	// class ("capacity", "account", …; see captchaai.Class), "dial",
	// "transport", "timeout", "canceled", "http_429", "http_5xx" or
	// "not_protocol". The set is bounded: safe as a metric label.
	Class string
	// Dur is the exchange's duration (waits for limits excluded).
	Dur time.Duration
	// Err is the transport error, if any.
	Err error
}
