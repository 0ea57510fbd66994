package upstream

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"time"

	"golang.org/x/time/rate"
)

// DefaultBaseURL is where CaptchaAI lives.
const DefaultBaseURL = "https://ocr.captchaai.com"

// Defaults that Config.WithDefaults substitutes for zero fields.
const (
	defaultTimeout      = 30 * time.Second
	defaultMaxWait      = 5 * time.Second
	defaultMaxAttempts  = 3
	defaultBackoffBase  = 500 * time.Millisecond
	defaultBackoffCap   = 10 * time.Second
	defaultRetryBudget  = 0.2
	defaultRetryReserve = 1.0
	defaultMaxBody      = 1 << 20
	defaultBadKeyTTL    = 5 * time.Minute
)

// Config tunes a Client. The zero value is usable: every zero field means
// "the default" stated on it, applied once by New (see WithDefaults).
type Config struct {
	// BaseURL is CaptchaAI's scheme and host (and optional path prefix),
	// e.g. "https://ocr.captchaai.com". "" means DefaultBaseURL. It must be
	// an absolute http or https URL without query or fragment.
	BaseURL string `toml:"base_url"`
	// Timeout bounds one attempt (one HTTP exchange, body included). 0 means
	// 30s. The caller's context bounds the whole call, all attempts and
	// waits included.
	Timeout time.Duration `toml:"timeout"`

	// Rate is the most requests per second solveonce sends to CaptchaAI, all
	// keys together; Burst is how many may go at once after a quiet spell.
	// Rate 0 means unlimited. Burst 0 means max(1, ceil(Rate)).
	Rate  float64 `toml:"rate"`
	Burst int     `toml:"burst"`
	// KeyRate and KeyBurst are the same limit per API key. KeyRate 0 means
	// unlimited; KeyBurst 0 means max(1, ceil(KeyRate)).
	KeyRate  float64 `toml:"key_rate"`
	KeyBurst int     `toml:"key_burst"`
	// MaxInFlight caps concurrent upstream requests (CaptchaAI plans are
	// sold in threads). 0 means unlimited.
	MaxInFlight int64 `toml:"max_in_flight"`
	// MaxWait is the longest one attempt waits for its turn (key limit,
	// in-flight slot, global limit together; also a new key's first-answer
	// gate) before it is refused with ErrRateLimited. 0 means 5s. The
	// caller's deadline bounds it too: a wait that would outlast the
	// deadline is refused at once.
	MaxWait time.Duration `toml:"max_wait"`

	// MaxAttempts is the most attempts per call, the first included. 0
	// means 3; 1 disables retries.
	MaxAttempts int `toml:"max_attempts"`
	// BackoffBase and BackoffCap shape the wait before retry n (n = 1, 2,
	// …): a uniformly random duration in [0, min(BackoffCap,
	// BackoffBase·2^(n-1))) ("full jitter"). 0 means 500ms and 10s. A
	// Retry-After sent by CaptchaAI (with a 429, say) raises the wait to
	// at least what it announces, and one longer than BackoffCap ends the
	// retries; no other floor is applied (CaptchaAI's
	// generic "wait 5 s" advice is a BackoffBase of 5s away, but a retry
	// that slow rarely fits in a client's own deadline). A retry whose
	// wait would end after the caller's deadline is not attempted.
	BackoffBase time.Duration `toml:"backoff_base"`
	BackoffCap  time.Duration `toml:"backoff_cap"`
	// RetryBudget is the share of upstream requests that may be retries:
	// over a rolling 10 s window, retries may not exceed RetryBudget times
	// the calls that reached CaptchaAI (Finagle's retry budget; Envoy's
	// budget_percent). 0 means 0.2; a negative value means no retries
	// beyond RetryReserve.
	RetryBudget float64 `toml:"retry_budget"`
	// RetryReserve is the number of retries per second always allowed, so
	// that a lone request can still be retried when traffic is too thin to
	// fund the budget (Envoy's min_retry_concurrency). The budget allows a
	// retry when either the ratio or the reserve allows it (the larger
	// wins; they do not add up). 0 means 1; a negative value means none.
	RetryReserve float64 `toml:"retry_reserve"`

	// MaxBody bounds the bytes read of one upstream response. 0 means 1 MiB.
	// A longer response is treated as a failed exchange.
	MaxBody int64 `toml:"max_body"`
	// BadKeyTTL is how long a key that CaptchaAI rejected (wrong or unknown
	// key, IP not allowed) is answered locally, and how long a key that
	// CaptchaAI accepted stays trusted without being seen. 0 means 5m. IP
	// ban answers are remembered for the longer of BadKeyTTL and the ban
	// CaptchaAI announces.
	BadKeyTTL time.Duration `toml:"bad_key_ttl"`
}

// WithDefaults returns c with every zero field replaced by its default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.Timeout == 0 {
		c.Timeout = defaultTimeout
	}
	if c.Burst == 0 && c.Rate > 0 {
		c.Burst = burstFor(c.Rate)
	}
	if c.KeyBurst == 0 && c.KeyRate > 0 {
		c.KeyBurst = burstFor(c.KeyRate)
	}
	if c.MaxWait == 0 {
		c.MaxWait = defaultMaxWait
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = defaultMaxAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = defaultBackoffBase
	}
	if c.BackoffCap == 0 {
		c.BackoffCap = defaultBackoffCap
	}
	if c.RetryBudget == 0 {
		c.RetryBudget = defaultRetryBudget
	}
	if c.RetryReserve == 0 {
		c.RetryReserve = defaultRetryReserve
	}
	if c.MaxBody == 0 {
		c.MaxBody = defaultMaxBody
	}
	if c.BadKeyTTL == 0 {
		c.BadKeyTTL = defaultBadKeyTTL
	}
	return c
}

func burstFor(r float64) int {
	if r >= math.MaxInt32 {
		return math.MaxInt32
	}
	return max(1, int(math.Ceil(r)))
}

// Validate reports every problem of c (after WithDefaults) in one error.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("upstream: "+format, args...)) }
	if _, err := parseBaseURL(c.BaseURL); err != nil {
		errs = append(errs, err)
	}
	if c.Timeout < 0 {
		bad("timeout %v is negative", c.Timeout)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) {
		bad("rate %v must be >= 0", c.Rate)
	}
	if c.KeyRate < 0 || math.IsNaN(c.KeyRate) {
		bad("key_rate %v must be >= 0", c.KeyRate)
	}
	if c.Burst < 0 {
		bad("burst %d is negative", c.Burst)
	}
	if c.KeyBurst < 0 {
		bad("key_burst %d is negative", c.KeyBurst)
	}
	if c.MaxInFlight < 0 {
		bad("max_in_flight %d is negative", c.MaxInFlight)
	}
	if c.MaxWait < 0 {
		bad("max_wait %v is negative", c.MaxWait)
	}
	if c.MaxAttempts < 0 {
		bad("max_attempts %d is negative", c.MaxAttempts)
	}
	if c.BackoffBase < 0 || c.BackoffCap < 0 {
		bad("backoff_base %v and backoff_cap %v must be >= 0", c.BackoffBase, c.BackoffCap)
	}
	if math.IsNaN(c.RetryBudget) || math.IsNaN(c.RetryReserve) {
		bad("retry_budget and retry_reserve must be numbers")
	}
	if c.MaxBody < 0 {
		bad("max_body %d is negative", c.MaxBody)
	}
	if c.BadKeyTTL < 0 {
		bad("bad_key_ttl %v is negative", c.BadKeyTTL)
	}
	return errors.Join(errs...)
}

// parseBaseURL checks a base URL: absolute, http or https, a host, no
// query, fragment or user info.
func parseBaseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("upstream: base_url %q: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("upstream: base_url %q: scheme must be http or https", s)
	case u.Host == "":
		return nil, fmt.Errorf("upstream: base_url %q: no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("upstream: base_url %q: user info not allowed", s)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("upstream: base_url %q: query and fragment not allowed", s)
	}
	return u, nil
}

// limit returns the rate.Limit for a configured rate: 0 means rate.Inf.
func limit(r float64) rate.Limit {
	if r <= 0 || math.IsInf(r, 1) {
		return rate.Inf
	}
	return rate.Limit(r)
}
