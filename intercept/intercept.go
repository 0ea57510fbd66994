// Package intercept answers repeated CaptchaAI submissions and polls without
// asking CaptchaAI again.
//
// A Layer sits between the proxy and the upstream client. Identical in.php
// submissions (same API key, same fingerprint) share one upstream task under
// a per-family Policy; res.php polls are answered from the answer cache and
// concurrent polls for one task share one upstream call. The Layer knows
// CaptchaAI semantics but not HTTP transport, Redis or Prometheus: it takes
// the two small interfaces it needs (Upstream, AnswerCache) and a
// store.Index for the exact, possibly shared, submission index.
package intercept

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/store"
)

// Upstream is what intercept needs from CaptchaAI; *upstream.Client
// satisfies it.
type Upstream interface {
	Submit(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error)
	Result(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error)
	Forward(ctx context.Context, r *captchaai.Request) (captchaai.Answer, error)
}

// AnswerCache is satisfied by *cache.Answers. A Put may be dropped.
type AnswerCache interface {
	Get(key string) (captchaai.Answer, bool)
	// Put stores an answer for ttl; ttl 0 lets the cache choose from the
	// answer (terminal vs. CAPCHA_NOT_READY).
	Put(key string, a captchaai.Answer, ttl time.Duration) bool
}

// Pingbacks takes the pingback (callback) subscriptions that CaptchaAI will
// not serve because the submission was merged into an existing task:
// solveonce must deliver them itself. Subscribe must not block for long.
type Pingbacks interface {
	Subscribe(ctx context.Context, s Subscription)
}

// Subscription is one merged submission that asked for a pingback.
type Subscription struct {
	Key     string // API key of the task (to poll it); never log it
	Account string // captchaai.AccountOf(Key), safe to log
	Task    string // upstream task ID
	Method  string // in.php method as sent
	URL     string // the submission's pingback parameter
}

// Config configures a Layer. Zero fields mean the documented default.
type Config struct {
	// ClaimTTL is how long a submission being sent upstream holds its
	// fingerprint before another replica may take over (the lease is
	// renewed while the call is in flight); 0 → 30s.
	ClaimTTL time.Duration `toml:"claim_ttl"`
	// LeaderTimeout bounds the shared upstream work of one submission or
	// poll after its callers have left; 0 → 90s.
	LeaderTimeout time.Duration `toml:"leader_timeout"`
	// IdempotencyWindow is how long an Idempotency-Key is remembered; 0 →
	// 10m.
	IdempotencyWindow time.Duration `toml:"idempotency_window"`
	// Policies say, per method family ("image", "userrecaptcha",
	// "turnstile", …), when a new identical submission may be handed an
	// existing task. Families without a policy are never deduplicated.
	// nil → DefaultPolicies().
	Policies map[string]Policy `toml:"policies"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.ClaimTTL <= 0 {
		c.ClaimTTL = 30 * time.Second
	}
	if c.LeaderTimeout <= 0 {
		c.LeaderTimeout = 90 * time.Second
	}
	if c.IdempotencyWindow <= 0 {
		c.IdempotencyWindow = 10 * time.Minute
	}
	if c.Policies == nil {
		c.Policies = DefaultPolicies()
	}
	return c
}

// Layer is the deduplicating core. Create it with New; it is safe for
// concurrent use.
type Layer struct {
	// Stats are atomic counters, read by metrics at scrape time.
	Stats Stats

	cfg     Config
	up      Upstream
	answers AnswerCache
	index   store.Index
	log     *slog.Logger
	pings   Pingbacks // nil: merged pingbacks are not served
	now     func() time.Time
	self    string // this replica's name in claims

	mu      sync.Mutex               // guards submits, polls, idTypes
	submits map[string]*submitFlight // in-process submissions by index key
	polls   map[string]*flight       // in-process polls by cache key
	idTypes map[string]bool          // method → upstream sends numeric JSON task IDs

	accounts  sync.Map     // API key → account name, memo of captchaai.AccountOf
	naccounts atomic.Int64 // entries in accounts
	tasks     sync.Map     // account:id → *task this replica knows
	ntasks    atomic.Int64 // approximate size of tasks

	work      sync.WaitGroup // shared upstream calls still running
	closeOnce sync.Once
	closed    chan struct{}
}

// Option changes a Layer built by New.
type Option func(*Layer)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(log *slog.Logger) Option { return func(l *Layer) { l.log = log } }

// WithPingbacks makes the Layer hand merged submissions' pingbacks to p.
func WithPingbacks(p Pingbacks) Option { return func(l *Layer) { l.pings = p } }

// WithClock sets the clock (default time.Now), for tests.
func WithClock(now func() time.Time) Option { return func(l *Layer) { l.now = now } }

// WithReplica names this replica in shared claims (default: random).
func WithReplica(name string) Option { return func(l *Layer) { l.self = name } }

// New returns a Layer over up, answers and index.
func New(cfg Config, up Upstream, answers AnswerCache, index store.Index, opts ...Option) *Layer {
	l := &Layer{
		cfg:     cfg.WithDefaults(),
		up:      up,
		answers: answers,
		index:   index,
		log:     slog.Default(),
		now:     time.Now,
		submits: make(map[string]*submitFlight),
		polls:   make(map[string]*flight),
		idTypes: make(map[string]bool),
		closed:  make(chan struct{}),
	}
	for _, o := range opts {
		o(l)
	}
	if l.self == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		l.self = hex.EncodeToString(b[:])
	}
	return l
}

// maxAccounts bounds the account-name memo; keys beyond it are hashed on
// every request, which is only slower.
const maxAccounts = 10_000

// account returns r's account name, remembering it per key so the poll hot
// path does not hash the key every time.
func (l *Layer) account(r *captchaai.Request) string {
	if v, ok := l.accounts.Load(r.Key()); ok {
		return v.(string)
	}
	a := r.Account()
	if l.naccounts.Load() < maxAccounts {
		if _, loaded := l.accounts.LoadOrStore(r.Key(), a); !loaded {
			l.naccounts.Add(1)
		}
	}
	return a
}

// Config returns the effective configuration.
func (l *Layer) Config() Config { return l.cfg }

// Policy returns the policy for a family and whether it has one.
func (l *Layer) Policy(f captchaai.Family) (Policy, bool) {
	p, ok := l.cfg.Policies[string(f)]
	if !ok || p.Reuse == ReuseNever {
		return Policy{}, false
	}
	return p.withDefaults(), true
}

// Wait blocks until every shared upstream call started so far has finished
// or ctx is done. Call it during graceful shutdown, after the listeners have
// stopped accepting requests, so that submissions that reached CaptchaAI are
// recorded.
func (l *Layer) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { l.work.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("intercept: waiting for shared calls: %w", ctx.Err())
	}
}

func randRead(b []byte) { _, _ = rand.Read(b) }

// flight is one shared upstream call in this process.
type flight struct {
	done chan struct{} // closed when ans/err are set
	ans  captchaai.Answer
	err  error

	// holders counts callers still waiting for a submission's answer;
	// guarded by Layer.mu. Used by the orphans policy.
	holders int
	owner   string // claim owner in the index
}

// TrackedTasks returns how many tasks this replica currently tracks
// locally (an approximation; the index may hold more).
func (l *Layer) TrackedTasks() int64 { return l.ntasks.Load() }
