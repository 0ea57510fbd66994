// Package metrics exports solveonce's counters to Prometheus.
//
// The hot path only ever adds to atomics that its own packages own
// (intercept.Stats, upstream.Stats, the circuit's state, the answer cache's
// counters). This package reads them when Prometheus scrapes, through
// CounterFunc and GaugeFunc collectors registered on a registry the caller
// supplies (never the global one), so exporting metrics adds no lock and no
// allocation to a request. The one exception is AttemptObserver, a
// histogram of upstream attempts fed from upstream.Client.Observe: it runs
// once per HTTP exchange with CaptchaAI, never on a cache hit.
//
// Labels are bounded and never carry an API key: endpoint ("in.php",
// "res.php", "other"), outcome, method family (the configured families plus
// "other"), upstream outcome class, circuit state, currency.
//
// Summarize turns the same sources into the savings report that the admin
// listener serves as /stats and as its status page.
package metrics

import (
	"errors"
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

// Namespace starts every metric name.
const Namespace = "solveonce"

// Sources are the counters Register and Summarize read. Every field may be
// nil (or zero): the metrics it would feed are then not registered, so a
// component that is absent, or not built yet, simply has no series.
type Sources struct {
	// Intercept is the deduplicating layer's counters: client requests by
	// endpoint and outcome, submissions saved, polls absorbed, money saved.
	Intercept *intercept.Stats
	// Upstream is the CaptchaAI client's counters: calls, retries,
	// rate-limit waits and refusals, breaker refusals, ambiguous
	// submissions.
	Upstream *upstream.Stats
	// Circuit is the upstream circuit breaker: state and transitions.
	Circuit *breaker.Circuit
	// Cache is the answer cache: entries and hit ratio.
	Cache *cache.Answers
	// Prices turn saved submissions into money.
	Prices Prices

	// TrackedTasks returns how many tasks this replica tracks (intercept's
	// task table).
	TrackedTasks func() int64
	// Certificates returns how many MITM leaf certificates the proxy has
	// generated since start.
	Certificates func() int64
	// StoreDegraded reports whether the submission index runs degraded
	// (for example a Redis index that failed over to local memory).
	StoreDegraded func() bool
	// StoreFailover is the failover index's counters (switches, primary
	// errors, operations served locally).
	StoreFailover *store.FailoverStats
}

// Register adds solveonce's collectors for s to reg. It returns the
// registration errors joined (for example when called twice on one
// registry); the collectors that did register stay registered.
func Register(reg prometheus.Registerer, s Sources) error {
	var cs []prometheus.Collector
	if s.Intercept != nil {
		cs = append(cs, interceptCollectors(s.Intercept, s.Prices)...)
	}
	if s.Upstream != nil {
		cs = append(cs, upstreamCollectors(s.Upstream)...)
	}
	if s.Circuit != nil {
		cs = append(cs, circuitCollectors(s.Circuit)...)
	}
	if s.Cache != nil {
		c := s.Cache
		cs = append(cs,
			gauge("answer_cache_entries", "Answers held in the answer cache (approximate).",
				func() float64 { return float64(c.Len()) }),
			gauge("answer_cache_hit_ratio", "Share of answer-cache lookups that hit, since start.",
				c.HitRatio),
		)
	}
	if f := s.TrackedTasks; f != nil {
		cs = append(cs, gauge("tracked_tasks", "Tasks this replica tracks (deduplicated submissions whose answers it may serve).",
			func() float64 { return float64(f()) }))
	}
	if f := s.Certificates; f != nil {
		cs = append(cs, counter("mitm_certificates_generated_total", "MITM leaf certificates generated since start.",
			func() float64 { return float64(f()) }))
	}
	if f := s.StoreDegraded; f != nil {
		cs = append(cs, gauge("store_degraded", "1 while the submission index runs degraded (e.g. Redis failed over to local memory), else 0.",
			func() float64 { return b2f(f()) }))
	}
	if f := s.StoreFailover; f != nil {
		cs = append(cs,
			counter("store_degradations_total", "Switches of the submission index from the shared store to its local fallback.", loader(&f.Degradations)),
			counter("store_recoveries_total", "Switches of the submission index back to the shared store.", loader(&f.Recoveries)),
			counter("store_primary_errors_total", "Shared-store operations that failed or timed out.", loader(&f.PrimaryErrors)),
			counter("store_fallback_operations_total", "Submission-index operations served by the local fallback.", loader(&f.Fallbacks)),
			counter("store_restored_keys_total", "Keys written during an outage and copied to the shared store on recovery.", loader(&f.Restored)),
		)
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("metrics: register: %w", err)
	}
	return nil
}

// interceptCollectors export the deduplicating layer.
func interceptCollectors(st *intercept.Stats, p Prices) []prometheus.Collector {
	client := func(endpoint, outcome string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "client_requests_total",
			Help: "Client requests answered, by endpoint and outcome: miss (needed its own upstream call; " +
				"for res.php, upstream polls made for clients), shared (joined a call in flight), " +
				"replayed (a repeated submission handed its existing task), hit (answered from memory).",
			ConstLabels: prometheus.Labels{"endpoint": endpoint, "outcome": outcome},
		}, f)
	}
	received := func(endpoint string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace:   Namespace,
			Name:        "client_requests_received_total",
			Help:        "Client requests received by endpoint, whatever became of them (failed and abandoned ones included).",
			ConstLabels: prometheus.Labels{"endpoint": endpoint},
		}, f)
	}
	load := loader
	return []prometheus.Collector{
		received("in.php", load(&st.Submits)),
		received("res.php", load(&st.Polls)),
		received("report", load(&st.Reports)),

		client("in.php", "miss", func() float64 {
			var n int64
			st.Families(func(_ string, fs *intercept.FamilyStats) { n += fs.Upstream.Load() })
			return float64(n)
		}),
		client("in.php", "shared", load(&st.SubmitsShared)),
		client("in.php", "replayed", load(&st.SubmitsReplayed)),
		client("res.php", "miss", load(&st.PollsUpstream)),
		client("res.php", "shared", load(&st.PollsShared)),
		client("res.php", "hit", load(&st.PollHits)),
		client("report", "hit", load(&st.ReportsAbsorbed)),

		counter("submits_upstream_total", "in.php submissions solveonce sent to CaptchaAI (one per task it created, plus undeduplicated ones).",
			load(&st.SubmitsUpstream)),
		counter("submits_direct_total", "in.php submissions passed through without deduplication (method without a policy, unparsable).",
			load(&st.SubmitsDirect)),
		counter("submits_saved_total", "in.php submissions answered with an existing task instead of a new paid one (shared + replayed).",
			func() float64 { return float64(st.SubmitsShared.Load() + st.SubmitsReplayed.Load()) }),
		counter("polls_absorbed_total", "res.php polls answered without an upstream call of their own (cache hits + shared polls).",
			func() float64 { return float64(st.PollHits.Load() + st.PollsShared.Load()) }),
		counter("reports_absorbed_total", "Repeated reportbad/reportgood answered locally.",
			load(&st.ReportsAbsorbed)),
		counter("index_evictions_total", "Tasks dropped from the submission index (unsolvable, reported bad).",
			load(&st.Evictions)),
		counter("store_errors_total", "Submission-index operations that failed (deduplication fell back to this replica).",
			load(&st.StoreErrors)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "money_saved_total",
			Help: "Estimated money saved: submissions saved per method family times that family's configured price " +
				"per 1,000 solves (metrics.prices, metrics.price_per_1000), divided by 1,000.",
			ConstLabels: prometheus.Labels{"currency": p.currency()},
		}, func() float64 { return moneySaved(st, p) }),
		&familyCollector{st: st},
	}
}

// moneySaved sums the saved submissions of every family at its price.
func moneySaved(st *intercept.Stats, p Prices) float64 {
	var nano int64
	st.Families(func(fam string, fs *intercept.FamilyStats) {
		nano += (fs.Shared.Load() + fs.Replayed.Load()) * p.nanoPerSolve(fam)
	})
	return float64(nano) / 1e9
}

// familyCollector exports the per-family counters. Families appear as
// clients use them, so it is a Collector rather than a set of CounterFuncs;
// it is "unchecked" (Describe sends nothing) because its label values are
// only known at scrape time.
type familyCollector struct{ st *intercept.Stats }

var familyDesc = prometheus.NewDesc(Namespace+"_method_submits_total",
	"in.php submissions by method family and outcome (miss, shared, replayed); received counts them all.",
	[]string{"family", "outcome"}, nil)

func (c *familyCollector) Describe(chan<- *prometheus.Desc) {}

func (c *familyCollector) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		fam string
		fs  *intercept.FamilyStats
	}
	var rows []row
	c.st.Families(func(fam string, fs *intercept.FamilyStats) { rows = append(rows, row{fam, fs}) })
	sort.Slice(rows, func(i, j int) bool { return rows[i].fam < rows[j].fam })
	for _, r := range rows {
		for _, v := range []struct {
			outcome string
			n       int64
		}{
			{"received", r.fs.Submits.Load()},
			{"miss", r.fs.Upstream.Load()},
			{"shared", r.fs.Shared.Load()},
			{"replayed", r.fs.Replayed.Load()},
		} {
			ch <- prometheus.MustNewConstMetric(familyDesc, prometheus.CounterValue, float64(v.n), r.fam, v.outcome)
		}
	}
}

// upstreamCollectors export the CaptchaAI client's counters.
func upstreamCollectors(st *upstream.Stats) []prometheus.Collector {
	load := loader
	return []prometheus.Collector{
		counter("upstream_calls_total", "Calls to the CaptchaAI client (each may make several attempts, or none when answered locally).", load(&st.Requests)),
		counter("upstream_attempts_total", "HTTP exchanges started with CaptchaAI, first tries and retries.", load(&st.Attempts)),
		counter("upstream_retries_total", "Upstream attempts after the first of their call.", load(&st.Retries)),
		counter("upstream_retries_denied_total", "Retries the retry budget refused.", load(&st.RetriesDenied)),
		counter("upstream_rate_limit_waits_total", "Upstream attempts that waited for a rate limit or an in-flight slot.", load(&st.RateLimitWaits)),
		counter("upstream_rate_limit_rejects_total", "Upstream calls refused because their turn did not come within upstream.max_wait.", load(&st.RateLimitRejects)),
		counter("upstream_breaker_rejects_total", "Upstream calls refused because the circuit was open.", load(&st.BreakerRejects)),
		counter("upstream_bad_key_local_total", "Calls answered locally for an API key CaptchaAI rejected.", load(&st.BadKeyLocal)),
		counter("upstream_key_pauses_total", "Throttle answers that paused an API key.", load(&st.Pauses)),
		counter("upstream_paused_rejects_total", "Calls refused because their API key was paused.", load(&st.Paused)),
		counter("upstream_ambiguous_total", "in.php submissions sent without a usable answer (never resent).", load(&st.Ambiguous)),
		counter("upstream_failures_total", "Upstream attempts the circuit counted as CaptchaAI failing.", load(&st.Failures)),
		counter("breaker_opens_total", "Times the upstream circuit opened.", load(&st.BreakerOpens)),
	}
}

// circuitCollectors export the breaker: one 0/1 gauge per state (alert on
// solveonce_breaker_state{state="open"} == 1) and the transitions.
func circuitCollectors(c *breaker.Circuit) []prometheus.Collector {
	var cs []prometheus.Collector
	for _, s := range []breaker.State{breaker.Closed, breaker.HalfOpen, breaker.Open} {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace:   Namespace,
			Name:        "breaker_state",
			Help:        "1 for the upstream circuit's current state, 0 for the others.",
			ConstLabels: prometheus.Labels{"state": s.String()},
		}, func() float64 { return b2f(c.State() == s) }))
	}
	return append(cs, counter("breaker_transitions_total", "Upstream circuit state changes since start.",
		func() float64 { return float64(c.Transitions()) }))
}

// loader reads an atomic counter as a float, for a CounterFunc.
func loader(v interface{ Load() int64 }) func() float64 {
	return func() float64 { return float64(v.Load()) }
}

func counter(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, f)
}

func gauge(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, f)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
