// Package config reads solveonce's configuration: built-in defaults, then a
// TOML file, then SOLVEONCE_* environment variables, then flags (applied by
// main), and validates the result, naming every key that is wrong.
package config

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/pingback"
	"github.com/solveonce/solveonce/proxy"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

// File is the whole configuration, one section per package.
type File struct {
	// DataDir holds state that must survive restarts: the MITM CA and the
	// pingback dead-letter queue. "" → $XDG_CONFIG_HOME/solveonce (usually
	// ~/.config/solveonce).
	DataDir string `toml:"data_dir"`
	// ShutdownTimeout bounds a graceful shutdown (SIGINT, SIGTERM): the
	// proxy stops accepting, and in-flight requests and shared upstream
	// calls get this long to finish before solveonce exits. Keep it under
	// the orchestrator's grace period (Kubernetes 30s; docker stop 10s
	// unless -t or stop_grace_period says otherwise).
	ShutdownTimeout time.Duration `toml:"shutdown_timeout"`

	Proxy     proxy.Config     `toml:"proxy"`
	Upstream  upstream.Config  `toml:"upstream"`
	Breaker   breaker.Config   `toml:"breaker"`
	Cache     cache.Config     `toml:"cache"`
	Intercept intercept.Config `toml:"intercept"`
	Pingback  pingback.Config  `toml:"pingback"`
	Store     Store            `toml:"store"`
	Admin     Admin            `toml:"admin"`
	Metrics   Metrics          `toml:"metrics"`
	Log       Log              `toml:"log"`
}

// Store selects the submission index.
type Store struct {
	// Kind is "memory" (default: one process) or "redis" (shared by replicas).
	Kind string `toml:"kind"`
	// RedisURL is redis://host:port/db; the password comes from
	// SOLVEONCE_REDIS_PASSWORD, never from the file.
	RedisURL string `toml:"redis_url"`
	// Prefix starts every Redis key; "" → "solveonce:".
	Prefix string `toml:"prefix"`
	// Timeout bounds every Redis operation; past it (or on any Redis
	// error) the replica deduplicates on its own until Redis answers
	// again. 0 → 250ms.
	Timeout time.Duration `toml:"timeout"`
	// Memory sizes the in-memory index.
	Memory store.MemoryConfig `toml:"memory"`
}

// Admin is the admin listener (metrics, health, stats).
type Admin struct {
	// Listen is the admin address; "" → 127.0.0.1:9090; "off" disables it.
	Listen string `toml:"listen"`
	// ReadyRequiresStore makes /readyz fail while the submission index
	// (Redis) is unreachable, even when solveonce keeps serving from a
	// local fallback. false reports that state as degraded instead, so
	// that replicas sharing one Redis stay in service through its outage
	// (deduplicating per replica meanwhile).
	ReadyRequiresStore bool `toml:"ready_requires_store"`
}

// Metrics prices the solves solveonce saves, for the estimated money
// saved in /metrics, /stats and the status page.
type Metrics struct {
	// Currency names the unit of the prices ("USD"); it is shown with the
	// figures and is the currency label of solveonce_money_saved_total.
	Currency string `toml:"currency"`
	// PricePer1000 is what 1,000 solves cost, for every method family
	// without its own entry in Prices. CaptchaAI sells threads rather than
	// solves: use your effective cost (plan price ÷ solves per month ×
	// 1,000). The default is illustrative.
	PricePer1000 float64 `toml:"price_per_1000"`
	// Prices are per method family ("image", "userrecaptcha",
	// "turnstile", …) prices of 1,000 solves, overriding PricePer1000.
	Prices map[string]float64 `toml:"prices"`
}

// Log configures logging.
type Log struct {
	Level  string `toml:"level"`  // debug, info (default), warn, error
	Format string `toml:"format"` // text (default) or json
}

// Default returns the built-in configuration: every zero value replaced by
// the default its package documents, so `go run .` needs no file.
func Default() File {
	return File{
		Proxy:     proxy.Config{}.WithDefaults(),
		Upstream:  upstream.Config{}.WithDefaults(),
		Breaker:   breaker.Config{}.WithDefaults(),
		Cache:     cache.Config{}.WithDefaults(),
		Intercept: intercept.Config{}.WithDefaults(),
		Pingback:  pingback.DefaultConfig(),
		Store:     Store{Kind: "memory", Prefix: "solveonce:", Timeout: store.DefaultFailoverTimeout, Memory: store.MemoryConfig{MaxEntries: 1_000_000}},
		Admin:     Admin{Listen: "127.0.0.1:9090"},
		Metrics:   Metrics{Currency: "USD", PricePer1000: 1, Prices: map[string]float64{}},
		Log:       Log{Level: "info", Format: "text"},

		ShutdownTimeout: 25 * time.Second,
	}
}

// Error lists every problem found in a configuration.
type Error struct{ Problems []string }

func (e *Error) Error() string {
	return "config: " + strings.Join(e.Problems, "; ")
}

// Parse overlays the TOML in r onto f. Unknown keys are an error that names
// them.
func Parse(r io.Reader, f *File) error {
	md, err := toml.NewDecoder(r).Decode(f)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = "unknown key " + k.String()
		}
		return &Error{Problems: keys}
	}
	return nil
}

// Load returns the defaults overlaid with the file at path ("" for none)
// and then the environment, validated.
func Load(path string, environ []string) (File, error) {
	f := Default()
	if path != "" {
		fh, err := os.Open(path)
		if err != nil {
			return File{}, fmt.Errorf("config: %w", err)
		}
		defer fh.Close()
		if err := Parse(fh, &f); err != nil {
			return File{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := ApplyEnv(&f, environ); err != nil {
		return File{}, err
	}
	return f, nil
}

// Validate checks the configuration and returns an *Error naming every bad
// key.
func (f File) Validate() error {
	var p []string
	bad := func(key, format string, a ...any) { p = append(p, key+": "+fmt.Sprintf(format, a...)) }
	if err := checkAddr(f.Proxy.Listen); err != nil {
		bad("proxy.listen", "%v", err)
	}
	if err := f.Proxy.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p = append(p, line)
		}
	}
	if f.Admin.Listen != "off" {
		if err := checkAddr(f.Admin.Listen); err != nil {
			bad("admin.listen", "%v", err)
		}
	}
	if u, err := url.Parse(f.Upstream.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("upstream.base_url", "%q is not an http(s) URL", f.Upstream.BaseURL)
	}
	switch f.Store.Kind {
	case "memory":
	case "redis":
		if u, err := url.Parse(f.Store.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			bad("store.redis_url", "%q is not a redis:// URL", f.Store.RedisURL)
		}
	default:
		bad("store.kind", "must be \"memory\" or \"redis\", not %q", f.Store.Kind)
	}
	if f.Store.Timeout < 0 {
		bad("store.timeout", "must not be negative")
	}
	if strings.ContainsAny(f.Store.Prefix, "{}") {
		bad("store.prefix", "must not contain braces (they delimit Redis Cluster hash tags)")
	}
	if f.ShutdownTimeout <= 0 {
		bad("shutdown_timeout", "must be positive, not %s", f.ShutdownTimeout)
	}
	if f.Metrics.PricePer1000 < 0 || math.IsNaN(f.Metrics.PricePer1000) || math.IsInf(f.Metrics.PricePer1000, 0) {
		bad("metrics.price_per_1000", "must be a finite price >= 0, not %v", f.Metrics.PricePer1000)
	}
	for fam, price := range f.Metrics.Prices {
		if price < 0 || math.IsNaN(price) || math.IsInf(price, 0) {
			bad("metrics.prices."+fam, "must be a finite price >= 0, not %v", price)
		}
	}
	switch f.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, not %q", f.Log.Level)
	}
	switch f.Log.Format {
	case "text", "json":
	default:
		bad("log.format", "must be text or json, not %q", f.Log.Format)
	}
	if f.Breaker.FailureRatio < 0 || f.Breaker.FailureRatio > 1 {
		bad("breaker.failure_ratio", "must be within 0..1")
	}
	for name, pol := range f.Intercept.Policies {
		if pol.Window < 0 || pol.OrphanAfter < 0 || pol.AnswerTTL < 0 {
			bad("intercept.policies."+name, "durations must not be negative")
		}
	}
	for _, problem := range f.Pingback.Problems() {
		p = append(p, "pingback."+problem)
	}
	if len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

func checkAddr(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	return nil
}

// IsError reports whether err is a configuration problem (as opposed to,
// say, a missing file).
func IsError(err error) bool {
	var e *Error
	return errors.As(err, &e)
}
