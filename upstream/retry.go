package upstream

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/solveonce/solveonce/captchaai"
)

// verdict is what one attempt's outcome means for the call it belongs to.
type verdict struct {
	// Retry: nothing was accepted, or the action is idempotent; another
	// attempt may be made (within attempts, budget and deadline).
	Retry bool
	// Ambiguous: an in.php submission was sent and the task may or may not
	// exist. Never retried.
	Ambiguous bool
	// Failure: CaptchaAI is failing; the circuit counts it.
	Failure bool
	// Raw: a non-protocol body to hand to the caller as StatusRaw (Forward,
	// and in.php rejected by an HTTP front with 3xx/4xx).
	Raw bool
	// Label names the outcome for Attempt.Class and logs (a bounded set).
	Label string
}

// policy groups request kinds by what may be retried.
type policy uint8

const (
	// policyOther: reports, unknown actions, solve.php. Only what provably
	// never reached CaptchaAI is retried.
	policyOther policy = iota
	// policySubmit: in.php. Retried only when provably nothing was created.
	policySubmit
	// policyIdempotent: res.php get (one id or ids=), getbalance.
	policyIdempotent
)

func policyOf(k captchaai.Kind) policy {
	switch k {
	case captchaai.KindSubmit:
		return policySubmit
	case captchaai.KindResult, captchaai.KindMultiResult, captchaai.KindBalance:
		return policyIdempotent
	default:
		return policyOther
	}
}

// classify is the one table of upstream outcomes (protocol doc §5, house
// rule 6). status is the HTTP status (0 without a response), a the parsed
// answer (Status StatusRaw when the body is no protocol answer), err the
// transport error (nil when a response was read).
//
//	outcome                      in.php      res.php get/getbalance  other      circuit
//	nothing sent (dial, refused) retry       retry                   retry      failure
//	sent, then timeout/reset     ambiguous   retry                   error      failure
//	HTTP 429                     retry       retry                   error      -
//	HTTP 5xx                     ambiguous   retry                   error      failure
//	non-protocol body, 2xx       ambiguous   retry                   raw        failure (not for other)
//	non-protocol body, 3xx/4xx   raw         retry                   raw        failure (not for other)
//	capacity code (NO_SLOT, …)   retry       retry                   answer     -
//	server code (SERVER_ERROR)   ambiguous   retry                   answer     failure
//	throttle code (MAX_USER_TURN) answer (key paused)                           -
//	account, request, terminal,
//	unknown codes; OK, NOT_READY answer                                         -
//
// "error" means the call fails with ErrUnavailable; "raw" that the body is
// handed back as a StatusRaw answer; "answer" that the protocol answer is
// returned as it is.
func classify(k captchaai.Kind, status int, a captchaai.Answer, err error) verdict {
	p := policyOf(k)
	switch {
	case err != nil && notSent(err):
		return verdict{Retry: true, Failure: true, Label: "dial"}
	case err != nil:
		label := "transport"
		if isTimeout(err) {
			label = "timeout"
		}
		if errors.Is(err, context.Canceled) {
			label = "canceled"
		}
		return verdict{Retry: p == policyIdempotent, Ambiguous: p == policySubmit, Failure: true, Label: label}
	case status == http.StatusTooManyRequests:
		return verdict{Retry: p != policyOther, Label: "http_429"}
	case status >= 500:
		return verdict{Retry: p == policyIdempotent, Ambiguous: p == policySubmit, Failure: true, Label: "http_5xx"}
	case a.Status == captchaai.StatusRaw:
		v := verdict{Failure: p != policyOther, Label: "not_protocol"}
		switch {
		case p == policyIdempotent:
			v.Retry = true
		case p == policySubmit && status < 300:
			v.Ambiguous = true
		default:
			v.Raw = true
		}
		return v
	case a.Status == captchaai.StatusError:
		class := captchaai.Classify(a.Value)
		v := verdict{Label: class.String()}
		switch class {
		case captchaai.ClassCapacity:
			v.Retry = p != policyOther
		case captchaai.ClassServer:
			v.Failure = true
			v.Retry = p == policyIdempotent
			v.Ambiguous = p == policySubmit
		}
		return v
	case a.Status == captchaai.StatusNotReady:
		return verdict{Label: "not_ready"}
	case a.Status == captchaai.StatusEmpty:
		return verdict{Label: "empty"}
	default:
		return verdict{Label: "ok"}
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// backoff returns the full-jitter wait before retry n (1 for the first
// retry): uniform in [0, min(cap, base·2^(n-1))). rnd(n) returns a uniform
// value in [0, n).
func backoff(n int, base, ceiling time.Duration, rnd func(int64) int64) time.Duration {
	if base <= 0 || ceiling <= 0 || n < 1 {
		return 0
	}
	d := ceiling
	if n-1 < 62 {
		if m := base << (n - 1); m > 0 && m>>(n-1) == base && m < ceiling {
			d = m
		}
	}
	return time.Duration(rnd(int64(d)))
}

// parseRetryAfter reads a Retry-After header (seconds or an HTTP date).
func parseRetryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	var secs int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			secs = -1
			break
		}
		secs = secs*10 + int64(c-'0')
		if secs > 86400 {
			return 24 * time.Hour
		}
	}
	if secs >= 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}

// budgetWindow is the span over which retries are weighed against calls.
const (
	budgetWindow  = 10 * time.Second
	budgetBuckets = 10
)

// budget is a retry budget: over the last budgetWindow, retries may not
// exceed max(ratio·calls, reserve·window). Each call that reaches CaptchaAI
// deposits (deposit); each retry must withdraw (withdraw). Taking the larger
// of the two (not their sum) keeps retries at or under ratio·calls whenever
// traffic is heavy enough to matter, while a lone request can still retry.
type budget struct {
	ratio float64 // retries per call; <= 0: none from the ratio
	floor float64 // retries per window always allowed; <= 0: none

	mu      sync.Mutex // guards buckets
	buckets [budgetBuckets]budgetBucket
}

type budgetBucket struct {
	slot           int64 // which bucketSpan-long slot of time this is
	calls, retries float64
}

const bucketSpan = budgetWindow / budgetBuckets

func newBudget(ratio, reservePerSec float64) *budget {
	return &budget{ratio: ratio, floor: reservePerSec * budgetWindow.Seconds()}
}

// bucketLocked returns the bucket for now, resetting it if it is stale.
func (b *budget) bucketLocked(now time.Time) *budgetBucket {
	slot := now.UnixNano() / int64(bucketSpan)
	bk := &b.buckets[slot%budgetBuckets]
	if bk.slot != slot {
		*bk = budgetBucket{slot: slot}
	}
	return bk
}

// deposit records one call that reached (or was about to reach) CaptchaAI.
func (b *budget) deposit(now time.Time) {
	b.mu.Lock()
	b.bucketLocked(now).calls++
	b.mu.Unlock()
}

// withdraw asks for one retry; true means it is allowed and recorded.
func (b *budget) withdraw(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.bucketLocked(now)
	oldest := cur.slot - budgetBuckets + 1
	var calls, retries float64
	for i := range b.buckets {
		if bk := &b.buckets[i]; bk.slot >= oldest && bk.slot <= cur.slot {
			calls += bk.calls
			retries += bk.retries
		}
	}
	if retries+1 > max(b.ratio*calls, b.floor) {
		return false
	}
	cur.retries++
	return true
}
