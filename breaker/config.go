package breaker

import "time"

// Defaults that WithDefaults substitutes for zero (or out-of-range) fields.
const (
	defaultMinRequests         = 10
	defaultFailureRatio        = 0.5
	defaultConsecutiveFailures = 5
	defaultWindow              = 30 * time.Second
	defaultOpenFor             = 15 * time.Second
	defaultProbes              = 1

	// windowBuckets is how many buckets the rolling window is split into:
	// results leave the window one bucket (Window/windowBuckets) at a time.
	windowBuckets = 10
)

// Config tunes a Circuit. The zero value is usable: every zero field means
// "use the default" (see WithDefaults).
//
// While closed, a circuit trips open when either rule fires on a failed call:
//
//   - ratio rule: at least MinRequests calls finished (succeeded or failed;
//     excluded calls and calls still in flight do not count) within the last
//     Window, and failures/finished >= FailureRatio;
//   - run rule: the last ConsecutiveFailures finished calls all failed. This
//     rule does not wait for MinRequests.
//
// Once open it rejects every call for OpenFor, then goes half-open and admits
// Probes calls: if all of them succeed it closes, if any fails it reopens for
// another OpenFor.
type Config struct {
	// MinRequests is the number of finished calls in the window below which
	// the ratio rule gives no verdict. 0 means 10.
	MinRequests uint32 `toml:"min_requests"`
	// FailureRatio is the share of failed calls in the window (0 < r <= 1)
	// at which the ratio rule trips. 0 (or any value that is not > 0) means
	// 0.5; a value above 1 disables the ratio rule.
	FailureRatio float64 `toml:"failure_ratio"`
	// ConsecutiveFailures is the length of an unbroken run of failures that
	// trips the circuit regardless of ratio and MinRequests. 0 means 5.
	ConsecutiveFailures uint32 `toml:"consecutive_failures"`
	// Window is the length of the rolling window the ratio rule looks at.
	// It is split into 10 buckets and results expire a bucket at a time, so
	// the effective window is Window rounded up to a multiple of Window/10.
	// 0 (or negative) means 30s.
	Window time.Duration `toml:"window"`
	// OpenFor is how long the circuit stays open before it goes half-open.
	// 0 (or negative) means 15s.
	OpenFor time.Duration `toml:"open_for"`
	// Probes is how many calls are admitted while half-open, and how many of
	// them must succeed to close the circuit. 0 means 1.
	Probes uint32 `toml:"probes"`
}

// WithDefaults returns c with every zero (or out-of-range) field replaced by
// its default.
func (c Config) WithDefaults() Config {
	if c.MinRequests == 0 {
		c.MinRequests = defaultMinRequests
	}
	if !(c.FailureRatio > 0) { // also catches NaN
		c.FailureRatio = defaultFailureRatio
	}
	if c.ConsecutiveFailures == 0 {
		c.ConsecutiveFailures = defaultConsecutiveFailures
	}
	if c.Window <= 0 {
		c.Window = defaultWindow
	}
	if c.OpenFor <= 0 {
		c.OpenFor = defaultOpenFor
	}
	if c.Probes == 0 {
		c.Probes = defaultProbes
	}
	return c
}
