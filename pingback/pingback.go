// Package pingback delivers the pingbacks (callbacks) that CaptchaAI cannot
// deliver because solveonce merged a submission into an existing task.
//
// The first submission of a task goes upstream unchanged, so CaptchaAI calls
// its pingback itself. Every merged submission that asked for a pingback is
// handed to a Service (it implements intercept.Pingbacks). The Service learns
// the task's answer by polling through the deduplicating layer (so its polls
// share the answer cache and the shared upstream polls with client polls),
// then calls each distinct pingback URL once, the way CaptchaAI does:
// GET <url>?id=<task>&code=<answer> (or a form POST, see Config.Method).
//
// Delivery is retried with exponential backoff and jitter on connection
// errors, timeouts and 5xx answers for up to Config.MaxAge; what cannot be
// delivered goes to a dead-letter queue (DLQ) kept in a bbolt file, listed and
// replayed with `solveonce dlq`. Successful deliveries are remembered in the
// same file, so a subscriber never gets the same task twice, across restarts
// too. API keys are kept in memory only, to poll: they are never written to
// disk or logs.
//
// Targets must pass an allow rule (see Rule), checked again on the resolved
// address at dial time so DNS rebinding cannot reach a refused address.
// Deliveries run on a bounded worker pool with a per-host concurrency cap, so
// a slow receiver can hold up neither other receivers nor the proxy.
package pingback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/solveonce/solveonce/captchaai"
)

// Config configures pingback delivery. Zero fields mean the documented
// default (see WithDefaults), except Enabled: use DefaultConfig.
type Config struct {
	// Enabled turns delivery to merged submissions' pingbacks on (default
	// true). When off, merged submissions' pingbacks are not called.
	Enabled bool `toml:"enabled"`
	// Method is how a pingback is called: "GET" (default; id and code
	// appended to the URL's query, as CaptchaAI's documentation shows) or
	// "POST" (id and code as an x-www-form-urlencoded body, as 2captcha
	// documents). Which one CaptchaAI really uses is unconfirmed.
	Method string `toml:"method"`
	// Allow lists the permitted targets: host names (exact, or ".example.com"
	// / "*.example.com" for subdomains), IP addresses and CIDRs. Empty: every
	// address except link-local, cloud metadata, multicast and unspecified
	// ones.
	Allow []string `toml:"allow"`
	// Workers is the number of concurrent deliveries (default 16); the same
	// number of answer polls may run at once.
	Workers int `toml:"workers"`
	// HostWorkers caps concurrent deliveries to one host:port (default 4), so
	// a slow receiver occupies at most that many workers.
	HostWorkers int `toml:"host_workers"`
	// Queue bounds the subscribers held at once, waiting for an answer or a
	// delivery (default 10000). A subscriber beyond it goes straight to the
	// dead-letter queue: the proxy is never blocked.
	Queue int `toml:"queue"`
	// Timeout bounds one delivery attempt, connection included (default 5s).
	Timeout time.Duration `toml:"timeout"`
	// MaxAge is how long a delivery is retried after the answer is known
	// (default 10m); then it is dead-lettered.
	MaxAge time.Duration `toml:"max_age"`
	// BackoffBase and BackoffCap shape the retry waits: attempt n waits
	// between half and all of min(cap, base·2^(n-1)) (defaults 1s and 1m).
	BackoffBase time.Duration `toml:"backoff_base"`
	BackoffCap  time.Duration `toml:"backoff_cap"`
	// PollInterval is the wait between two polls of a task's answer
	// (default 5s).
	PollInterval time.Duration `toml:"poll_interval"`
	// FirstPollImage and FirstPollToken are the waits before the first poll
	// of an image task (method post/base64; default 5s) and of any other
	// task (default 15s): the typical solve times.
	FirstPollImage time.Duration `toml:"first_poll_image"`
	FirstPollToken time.Duration `toml:"first_poll_token"`
	// PollDeadline is how long a task is polled before its subscribers are
	// dead-lettered without an answer (default 10m).
	PollDeadline time.Duration `toml:"poll_deadline"`
	// MaxResponse is how much of a receiver's response body is read (default
	// 4 KiB); the rest is discarded unread.
	MaxResponse int64 `toml:"max_response"`
	// DeliveredTTL is how long a successful delivery is remembered to keep
	// deliveries idempotent (default 24h).
	DeliveredTTL time.Duration `toml:"delivered_ttl"`
	// DLQPath is the bbolt file holding the dead-letter queue and the
	// delivered set; "" → pingback.db in the data directory.
	DLQPath string `toml:"dlq_path"`
}

// DefaultConfig returns the built-in configuration: enabled, every other
// field at its default.
func DefaultConfig() Config {
	c := Config{Enabled: true}.WithDefaults()
	c.Allow = []string{}
	return c
}

// WithDefaults returns c with zero fields set to their defaults. Enabled is
// left as it is.
func (c Config) WithDefaults() Config {
	if c.Method == "" {
		c.Method = "GET"
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.HostWorkers <= 0 {
		c.HostWorkers = 4
	}
	if c.Queue <= 0 {
		c.Queue = 10000
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 10 * time.Minute
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = time.Second
	}
	if c.BackoffCap <= 0 {
		c.BackoffCap = time.Minute
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 5 * time.Second
	}
	if c.FirstPollImage <= 0 {
		c.FirstPollImage = 5 * time.Second
	}
	if c.FirstPollToken <= 0 {
		c.FirstPollToken = 15 * time.Second
	}
	if c.PollDeadline <= 0 {
		c.PollDeadline = 10 * time.Minute
	}
	if c.MaxResponse <= 0 {
		c.MaxResponse = 4 << 10
	}
	if c.DeliveredTTL <= 0 {
		c.DeliveredTTL = 24 * time.Hour
	}
	return c
}

// Problems returns one line per invalid setting, each starting with the key
// relative to the [pingback] section ("method: …"); none for a valid
// configuration.
func (c Config) Problems() []string {
	var p []string
	switch c.Method {
	case "", "GET", "POST":
	default:
		p = append(p, fmt.Sprintf("method: must be \"GET\" or \"POST\", not %q", c.Method))
	}
	if _, err := ParseRule(c.Allow); err != nil {
		p = append(p, "allow: "+err.Error())
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"timeout", c.Timeout}, {"max_age", c.MaxAge}, {"backoff_base", c.BackoffBase},
		{"backoff_cap", c.BackoffCap}, {"poll_interval", c.PollInterval},
		{"first_poll_image", c.FirstPollImage}, {"first_poll_token", c.FirstPollToken},
		{"poll_deadline", c.PollDeadline}, {"delivered_ttl", c.DeliveredTTL},
	} {
		if d.v < 0 {
			p = append(p, d.key+": must not be negative")
		}
	}
	if c.Workers < 0 || c.HostWorkers < 0 || c.Queue < 0 || c.MaxResponse < 0 {
		p = append(p, "workers, host_workers, queue, max_response: must not be negative")
	}
	return p
}

// firstPoll is the wait before the first poll of a task submitted with the
// in.php method m.
func (c Config) firstPoll(method string) time.Duration {
	if (&captchaai.Request{Method: method}).Family() == captchaai.FamilyImage {
		return c.FirstPollImage
	}
	return c.FirstPollToken
}

// Path returns the dead-letter queue file of c: DLQPath, or pingback.db in
// dataDir, or in $XDG_CONFIG_HOME/solveonce (usually ~/.config/solveonce)
// when dataDir is "".
func (c Config) Path(dataDir string) (string, error) {
	if c.DLQPath != "" {
		return c.DLQPath, nil
	}
	if dataDir == "" {
		base, err := os.UserConfigDir()
		if err != nil {
			return "", fmt.Errorf("pingback: no data directory: %w", err)
		}
		dataDir = filepath.Join(base, "solveonce")
	}
	return filepath.Join(dataDir, "pingback.db"), nil
}

// ErrRefused is returned (wrapped) for a target the allow rule refuses.
var ErrRefused = errors.New("pingback: target refused by pingback.allow")
