package metrics

import (
	"math"
	"sort"
	"time"

	"github.com/solveonce/solveonce/intercept"
)

// Summary is the savings report since start, in the spirit of a classic
// deduplication report: what clients asked for, what reached CaptchaAI,
// and what that saved. It is what /stats serves as JSON.
type Summary struct {
	Since         time.Time `json:"since"`
	UptimeSeconds float64   `json:"uptime_seconds"`

	// Submissions is in.php requests received; Deduplicated those answered
	// with an existing task (Shared joined one in flight, Replayed got one
	// already made) instead of a new, paid one.
	Submissions  int64 `json:"submissions"`
	Deduplicated int64 `json:"deduplicated"`
	Shared       int64 `json:"shared"`
	Replayed     int64 `json:"replayed"`
	// SubmitsUpstream is in.php requests solveonce sent to CaptchaAI.
	SubmitsUpstream int64 `json:"submits_upstream"`
	// SavingsPercent is Deduplicated as a share of Submissions.
	SavingsPercent float64 `json:"savings_percent"`

	// Polls is res.php action=get requests received; PollsAbsorbed those
	// answered without an upstream poll of their own (cache hits, shared
	// polls); PollsUpstream the upstream polls made.
	Polls         int64 `json:"polls"`
	PollsAbsorbed int64 `json:"polls_absorbed"`
	PollsUpstream int64 `json:"polls_upstream"`
	// Reports and ReportsAbsorbed count reportbad/reportgood and the
	// repeats answered locally.
	Reports         int64 `json:"reports"`
	ReportsAbsorbed int64 `json:"reports_absorbed"`

	// UpstreamCallsAvoided is Deduplicated + PollsAbsorbed +
	// ReportsAbsorbed: client requests that cost CaptchaAI nothing.
	// UpstreamCallsAvoidedPercent is its share of all client requests.
	UpstreamCallsAvoided        int64   `json:"upstream_calls_avoided"`
	UpstreamCallsAvoidedPercent float64 `json:"upstream_calls_avoided_percent"`

	// MoneySaved is the estimated price of the deduplicated submissions.
	MoneySaved float64 `json:"money_saved"`
	Currency   string  `json:"currency"`

	// Methods breaks submissions down by method family, most used first.
	Methods []MethodSummary `json:"methods"`

	// Upstream and Cache are nil when their sources are.
	Upstream *UpstreamSummary `json:"upstream,omitempty"`
	Cache    *CacheSummary    `json:"cache,omitempty"`
}

// MethodSummary is one method family's line of the report.
type MethodSummary struct {
	Method          string  `json:"method"`
	Submissions     int64   `json:"submissions"`
	Deduplicated    int64   `json:"deduplicated"`
	SubmitsUpstream int64   `json:"submits_upstream"`
	SavingsPercent  float64 `json:"savings_percent"`
	MoneySaved      float64 `json:"money_saved"`
}

// UpstreamSummary is what solveonce did with CaptchaAI.
type UpstreamSummary struct {
	Calls          int64  `json:"calls"`
	Attempts       int64  `json:"attempts"`
	Retries        int64  `json:"retries"`
	RateLimitWaits int64  `json:"rate_limit_waits"`
	Failures       int64  `json:"failures"`
	Breaker        string `json:"breaker,omitempty"`
	Transitions    uint64 `json:"breaker_transitions"`
}

// CacheSummary is the answer cache's state.
type CacheSummary struct {
	Entries  int64   `json:"entries"`
	HitRatio float64 `json:"hit_ratio"`
}

// Summarize reads s into a Summary of everything since since, as of now.
func Summarize(s Sources, since, now time.Time) Summary {
	sum := Summary{
		Since:         since.UTC().Truncate(time.Second),
		UptimeSeconds: math.Round(now.Sub(since).Seconds()),
		Currency:      s.Prices.currency(),
		Methods:       []MethodSummary{},
	}
	if st := s.Intercept; st != nil {
		// Read the outcomes before the totals: a request in flight is
		// counted in its total first, so the totals are never smaller.
		sum.Shared, sum.Replayed = st.SubmitsShared.Load(), st.SubmitsReplayed.Load()
		sum.SubmitsUpstream = st.SubmitsUpstream.Load()
		sum.PollsAbsorbed = st.PollHits.Load() + st.PollsShared.Load()
		sum.PollsUpstream = st.PollsUpstream.Load()
		sum.ReportsAbsorbed = st.ReportsAbsorbed.Load()
		sum.Submissions, sum.Polls, sum.Reports = st.Submits.Load(), st.Polls.Load(), st.Reports.Load()

		sum.Deduplicated = sum.Shared + sum.Replayed
		sum.SavingsPercent = percent(sum.Deduplicated, sum.Submissions)
		sum.UpstreamCallsAvoided = sum.Deduplicated + sum.PollsAbsorbed + sum.ReportsAbsorbed
		sum.UpstreamCallsAvoidedPercent = percent(sum.UpstreamCallsAvoided, sum.Submissions+sum.Polls+sum.Reports)

		var saved int64 // in billionths of the currency
		st.Families(func(fam string, fs *intercept.FamilyStats) {
			m := MethodSummary{Method: fam, Deduplicated: fs.Shared.Load() + fs.Replayed.Load(), SubmitsUpstream: fs.Upstream.Load()}
			m.Submissions = fs.Submits.Load()
			m.SavingsPercent = percent(m.Deduplicated, m.Submissions)
			nano := m.Deduplicated * s.Prices.nanoPerSolve(fam)
			m.MoneySaved = round2(float64(nano) / 1e9)
			saved += nano
			sum.Methods = append(sum.Methods, m)
		})
		sum.MoneySaved = round2(float64(saved) / 1e9)
		sort.Slice(sum.Methods, func(i, j int) bool {
			a, b := sum.Methods[i], sum.Methods[j]
			if a.Submissions != b.Submissions {
				return a.Submissions > b.Submissions
			}
			return a.Method < b.Method
		})
	}
	if u := s.Upstream; u != nil {
		sum.Upstream = &UpstreamSummary{
			Calls:          u.Requests.Load(),
			Attempts:       u.Attempts.Load(),
			Retries:        u.Retries.Load(),
			RateLimitWaits: u.RateLimitWaits.Load(),
			Failures:       u.Failures.Load(),
		}
		if c := s.Circuit; c != nil {
			sum.Upstream.Breaker = c.State().String()
			sum.Upstream.Transitions = c.Transitions()
		}
	}
	if c := s.Cache; c != nil {
		sum.Cache = &CacheSummary{Entries: c.Len(), HitRatio: math.Round(c.HitRatio()*1000) / 1000}
	}
	return sum
}

// percent is part/whole × 100, rounded to two decimals; 0 when whole is 0.
func percent(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return round2(float64(part) * 100 / float64(whole))
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }
