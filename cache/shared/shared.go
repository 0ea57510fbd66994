// Package shared lets solveonce replicas share CaptchaAI answers: a Redis
// second level (Answers) under each replica's in-memory cache, joined by
// Tiered, so a task solved through one replica is served by every other
// without another upstream poll, and CAPCHA_NOT_READY collapses polls
// across replicas for the pending TTL.
//
// Like the in-memory level it is a cache, not a store: it fails open. Every
// Redis call is bounded by a short timeout; after a failure Redis is left
// alone for a backoff (doubling up to a cap) while Tiered serves from
// memory alone, and the first call after the backoff is the probe that
// brings it back. A client never waits on a dead Redis for longer than
// one timeout per backoff period, and never sees an error.
//
// # Keys and values
//
// An answer cached under key k lives in Redis under Prefix + "a:" + k as
// JSON (fields named in the wire type), expiring (PX) with the TTL it was
// put with. A CAPCHA_NOT_READY is written only where no answer is (SET NX),
// so a slower replica's stale poll can never hide a solution another
// replica already stored.
package shared

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/captchaai"
)

// Defaults of Config.
const (
	DefaultPrefix   = "solveonce:"
	DefaultTimeout  = 250 * time.Millisecond
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
)

// Config configures the Redis level. Zero fields mean the default.
type Config struct {
	// Prefix starts every key; "" → "solveonce:". Answers live under
	// Prefix + "a:" + key.
	Prefix string
	// Timeout bounds every Redis call; 0 → 250ms.
	Timeout time.Duration
	// RetryMin is how long Redis is left alone after a failure; it doubles
	// per consecutive failure up to RetryMax. 0 → 100ms and 5s.
	RetryMin, RetryMax time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.RetryMin <= 0 {
		c.RetryMin = DefaultRetryMin
	}
	if c.RetryMax <= 0 {
		c.RetryMax = DefaultRetryMax
	}
	c.RetryMax = max(c.RetryMax, c.RetryMin)
	return c
}

// Stats are the Redis level's counters, updated atomically.
type Stats struct {
	Hits    atomic.Int64 // Gets answered from Redis
	Misses  atomic.Int64 // Gets Redis had no answer for
	Puts    atomic.Int64 // answers written to Redis
	Errors  atomic.Int64 // Redis calls that failed or timed out
	Skipped atomic.Int64 // calls not made because Redis failed recently
}

// Answers is the Redis level of the answer cache. It is safe for
// concurrent use; create it with New.
type Answers struct {
	// Stats are the level's counters.
	Stats Stats

	rdb    redis.UniversalClient
	prefix string
	cfg    Config
	now    func() time.Time

	downUntil atomic.Int64 // unix ns before which Redis is skipped; 0 = healthy
	backoff   atomic.Int64 // current backoff (ns); 0 = healthy
}

// New returns the Redis level on rdb, which stays the caller's to close.
func New(rdb redis.UniversalClient, cfg Config) *Answers {
	cfg = cfg.WithDefaults()
	return &Answers{rdb: rdb, prefix: cfg.Prefix + "a:", cfg: cfg, now: time.Now}
}

// Config returns the effective configuration.
func (a *Answers) Config() Config { return a.cfg }

// RedisKey returns the Redis key holding the answer cached under key.
func (a *Answers) RedisKey(key string) string { return a.prefix + key }

// Healthy reports whether the last Redis call succeeded (or none failed
// yet).
func (a *Answers) Healthy() bool { return a.downUntil.Load() == 0 }

// Get returns the answer cached under key and the time it has left. Any
// failure is a miss.
func (a *Answers) Get(ctx context.Context, key string) (ans captchaai.Answer, ttl time.Duration, ok bool) {
	if !a.admit() {
		a.Stats.Skipped.Add(1)
		return captchaai.Answer{}, 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	rkey := a.RedisKey(key)
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, rkey)
		pttl = p.PTTL(ctx, rkey)
		return nil
	})
	if errors.Is(get.Err(), redis.Nil) {
		a.healthy()
		a.Stats.Misses.Add(1)
		return captchaai.Answer{}, 0, false
	}
	if err != nil {
		a.failed()
		return captchaai.Answer{}, 0, false
	}
	a.healthy()
	b, _ := get.Bytes()
	ans, err = decode(b)
	if err != nil {
		a.Stats.Misses.Add(1)
		return captchaai.Answer{}, 0, false
	}
	a.Stats.Hits.Add(1)
	return ans, max(pttl.Val(), 0), true
}

// Put stores ans under key for ttl (rounded up to a millisecond). A
// CAPCHA_NOT_READY is stored only where no answer is. It reports whether
// Redis took the answer; false is fine.
func (a *Answers) Put(ctx context.Context, key string, ans captchaai.Answer, ttl time.Duration) bool {
	if ttl <= 0 {
		return false
	}
	b, err := encode(ans)
	if err != nil {
		return false
	}
	if !a.admit() {
		a.Stats.Skipped.Add(1)
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	ttl = (ttl + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	args := redis.SetArgs{TTL: ttl}
	if ans.Status == captchaai.StatusNotReady {
		args.Mode = "NX"
	}
	err = a.rdb.SetArgs(ctx, a.RedisKey(key), b, args).Err()
	if errors.Is(err, redis.Nil) { // NX and an answer is there
		a.healthy()
		return false
	}
	if err != nil {
		a.failed()
		return false
	}
	a.healthy()
	a.Stats.Puts.Add(1)
	return true
}

// admit reports whether to call Redis now: always while healthy; during a
// backoff never, except for one caller once it has passed (the probe).
func (a *Answers) admit() bool {
	until := a.downUntil.Load()
	if until == 0 {
		return true
	}
	now := a.now().UnixNano()
	if now < until {
		return false
	}
	// Hold the others off while this call probes.
	return a.downUntil.CompareAndSwap(until, now+int64(a.cfg.Timeout))
}

// healthy records a successful call.
func (a *Answers) healthy() {
	if a.downUntil.Load() != 0 {
		a.backoff.Store(0)
		a.downUntil.Store(0)
	}
}

// failed records a failed call and starts (or doubles) the backoff.
func (a *Answers) failed() {
	a.Stats.Errors.Add(1)
	b := time.Duration(a.backoff.Load())
	if b == 0 {
		b = a.cfg.RetryMin
	} else {
		b = min(2*b, a.cfg.RetryMax)
	}
	a.backoff.Store(int64(b))
	a.downUntil.Store(a.now().Add(b).UnixNano())
}

// wire is an Answer as stored in Redis. Raw keeps nil and empty apart
// (null and ""), as the protocol distinguishes a synthesised answer from
// an empty body. JSONValue is kept as bytes (base64), not inline JSON,
// which encoding/json would compact and HTML-escape.
type wire struct {
	Status      captchaai.Status `json:"s"`
	Value       string           `json:"v,omitempty"`
	JSONValue   []byte           `json:"j,omitempty"`
	Raw         []byte           `json:"r"`
	Format      captchaai.Format `json:"f,omitempty"`
	ContentType string           `json:"c,omitempty"`
	Bare        bool             `json:"b,omitempty"`
	HTTPStatus  int              `json:"h,omitempty"`
}

func encode(a captchaai.Answer) ([]byte, error) {
	b, err := json.Marshal(wire{
		Status: a.Status, Value: a.Value, JSONValue: a.JSONValue, Raw: a.Raw, Format: a.Format,
		ContentType: a.ContentType, Bare: a.Bare, HTTPStatus: a.HTTPStatus,
	})
	if err != nil {
		return nil, fmt.Errorf("shared: encode answer: %w", err)
	}
	return b, nil
}

func decode(b []byte) (captchaai.Answer, error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return captchaai.Answer{}, fmt.Errorf("shared: decode answer: %w", err)
	}
	var jv json.RawMessage
	if len(w.JSONValue) > 0 {
		jv = w.JSONValue
	}
	return captchaai.Answer{
		Status: w.Status, Value: w.Value, JSONValue: jv, Raw: w.Raw, Format: w.Format,
		ContentType: w.ContentType, Bare: w.Bare, HTTPStatus: w.HTTPStatus,
	}, nil
}
