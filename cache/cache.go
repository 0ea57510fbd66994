// Package cache remembers CaptchaAI answers in memory, best effort, so that
// repeated polls for one task are answered without asking CaptchaAI again.
//
// It is a cache, not a store: a Put may be dropped (ristretto's admission
// policy decides) and an entry may disappear early. Callers must treat a miss
// as "ask upstream", never as "does not exist".
package cache

import (
	"fmt"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/solveonce/solveonce/captchaai"
)

// Config sizes the cache and says how long answers live.
type Config struct {
	// MaxBytes bounds the memory the answers may use; 0 → 64 MiB.
	MaxBytes int64 `toml:"max_bytes"`
	// DoneTTL is how long a terminal answer (solution or terminal error)
	// is kept when the caller gives no TTL; 0 → 10m.
	DoneTTL time.Duration `toml:"done_ttl"`
	// PendingTTL is how long CAPCHA_NOT_READY is reused, collapsing poll
	// storms to about one upstream poll per task per PendingTTL; keep it
	// under clients' poll interval (5 s); 0 → 2s.
	PendingTTL time.Duration `toml:"pending_ttl"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.MaxBytes <= 0 {
		c.MaxBytes = 64 << 20
	}
	if c.DoneTTL <= 0 {
		c.DoneTTL = 10 * time.Minute
	}
	if c.PendingTTL <= 0 {
		c.PendingTTL = 2 * time.Second
	}
	return c
}

// Answers is a concurrent, size-bounded answer cache.
type Answers struct {
	c   *ristretto.Cache[string, captchaai.Answer]
	cfg Config
}

// entryOverhead approximates the bytes an entry costs beyond its body.
const entryOverhead = 160

// New returns an empty cache.
func New(cfg Config) (*Answers, error) {
	cfg = cfg.WithDefaults()
	// Counters at ~10× the expected items; assume ~1 KiB per answer.
	counters := cfg.MaxBytes / 1024 * 10
	if counters < 1000 {
		counters = 1000
	}
	c, err := ristretto.NewCache(&ristretto.Config[string, captchaai.Answer]{
		NumCounters: counters,
		MaxCost:     cfg.MaxBytes,
		BufferItems: 64,
		Metrics:     true,
		Cost: func(a captchaai.Answer) int64 {
			return int64(len(a.Raw)+len(a.Value)+len(a.JSONValue)+len(a.ContentType)) + entryOverhead
		},
	})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return &Answers{c: c, cfg: cfg}, nil
}

// Config returns the effective configuration (defaults applied).
func (a *Answers) Config() Config { return a.cfg }

// Get returns the answer stored under key.
func (a *Answers) Get(key string) (captchaai.Answer, bool) { return a.c.Get(key) }

// Put stores ans under key for ttl; ttl 0 picks DoneTTL for terminal answers
// and PendingTTL for CAPCHA_NOT_READY. Other answers (transient errors) are
// never cached. It returns false when the answer was not stored, which is
// fine. A stored answer is visible to Get when Put returns.
func (a *Answers) Put(key string, ans captchaai.Answer, ttl time.Duration) bool {
	if ttl <= 0 {
		switch {
		case ans.Terminal():
			ttl = a.cfg.DoneTTL
		case ans.Status == captchaai.StatusNotReady:
			ttl = a.cfg.PendingTTL
		default:
			return false
		}
	}
	ok := a.c.SetWithTTL(key, ans, 0, ttl)
	a.c.Wait()
	return ok
}

// Delete removes key.
func (a *Answers) Delete(key string) { a.c.Del(key) }

// Len returns the number of cached answers (approximate).
func (a *Answers) Len() int64 {
	m := a.c.Metrics
	if m == nil {
		return 0
	}
	return int64(m.KeysAdded() - m.KeysEvicted())
}

// HitRatio returns the fraction of Gets that hit since start.
func (a *Answers) HitRatio() float64 {
	if a.c.Metrics == nil {
		return 0
	}
	return a.c.Metrics.Ratio()
}

// Close stops the cache's goroutines.
func (a *Answers) Close() { a.c.Close() }
