package metrics

import (
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

// gather scrapes reg into "name{k=v,…}" → value (histograms as _count and
// _sum).
func gather(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[strings.Replace(key, mf.GetName(), mf.GetName()+"_count", 1)] = float64(m.GetHistogram().GetSampleCount())
				out[strings.Replace(key, mf.GetName(), mf.GetName()+"_sum", 1)] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

func expect(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s: missing", k)
			continue
		}
		if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
}

// scripted fills the counters as a short session would.
func scripted() (*intercept.Stats, *upstream.Stats) {
	var st intercept.Stats
	st.Submits.Store(10)
	st.SubmitsUpstream.Store(3)
	st.SubmitsShared.Store(4)
	st.SubmitsReplayed.Store(2)
	img, rc := st.Family("image"), st.Family("userrecaptcha")
	img.Submits.Store(8)
	img.Upstream.Store(2)
	img.Shared.Store(4)
	img.Replayed.Store(2)
	rc.Submits.Store(2)
	rc.Upstream.Store(1)
	st.Polls.Store(20)
	st.PollHits.Store(12)
	st.PollsShared.Store(3)
	st.PollsUpstream.Store(5)
	st.Reports.Store(3)
	st.ReportsAbsorbed.Store(2)

	var up upstream.Stats
	up.Requests.Store(9)
	up.Attempts.Store(10)
	up.Retries.Store(1)
	up.RateLimitWaits.Store(2)
	up.BreakerOpens.Store(1)
	return &st, &up
}

func TestRegisterReadsCountersAtScrapeTime(t *testing.T) {
	st, up := scripted()
	answers, err := cache.New(cache.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer answers.Close()
	answers.Put("acct:1:t", captchaai.Text("CAPCHA_NOT_READY"), time.Minute)

	circuit := breaker.New("test", breaker.Config{}, nil)
	var fo store.FailoverStats
	fo.Degradations.Store(2)
	fo.Fallbacks.Store(40)
	reg := prometheus.NewPedanticRegistry()
	err = Register(reg, Sources{
		Intercept:     st,
		Upstream:      up,
		Circuit:       circuit,
		Cache:         answers,
		Prices:        Prices{Currency: "EUR", Per1000: 1, Family: map[string]float64{"userrecaptcha": 3}},
		TrackedTasks:  func() int64 { return 7 },
		Certificates:  func() int64 { return 2 },
		StoreDegraded: func() bool { return true },
		StoreFailover: &fo,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, reg)
	expect(t, got, map[string]float64{
		"solveonce_client_requests_received_total{endpoint=in.php}":           10,
		"solveonce_client_requests_received_total{endpoint=res.php}":          20,
		"solveonce_client_requests_total{endpoint=in.php,outcome=miss}":       3, // families' own upstream calls
		"solveonce_client_requests_total{endpoint=in.php,outcome=shared}":     4,
		"solveonce_client_requests_total{endpoint=in.php,outcome=replayed}":   2,
		"solveonce_client_requests_total{endpoint=res.php,outcome=hit}":       12,
		"solveonce_client_requests_total{endpoint=res.php,outcome=shared}":    3,
		"solveonce_client_requests_total{endpoint=res.php,outcome=miss}":      5,
		"solveonce_client_requests_total{endpoint=report,outcome=hit}":        2,
		"solveonce_submits_saved_total":                                       6,
		"solveonce_polls_absorbed_total":                                      15,
		"solveonce_money_saved_total{currency=EUR}":                           0.006, // 6 image solves at 1/1000
		"solveonce_method_submits_total{family=image,outcome=received}":       8,
		"solveonce_method_submits_total{family=image,outcome=replayed}":       2,
		"solveonce_method_submits_total{family=userrecaptcha,outcome=miss}":   1,
		"solveonce_upstream_attempts_total":                                   10,
		"solveonce_upstream_retries_total":                                    1,
		"solveonce_upstream_rate_limit_waits_total":                           2,
		"solveonce_breaker_opens_total":                                       1,
		"solveonce_breaker_state{state=closed}":                               1,
		"solveonce_breaker_state{state=open}":                                 0,
		"solveonce_breaker_transitions_total":                                 0,
		"solveonce_answer_cache_entries":                                      1,
		"solveonce_tracked_tasks":                                             7,
		"solveonce_mitm_certificates_generated_total":                         2,
		"solveonce_store_degraded":                                            1,
		"solveonce_store_degradations_total":                                  2,
		"solveonce_store_fallback_operations_total":                           40,
		"solveonce_client_requests_received_total{endpoint=report}":           3,
		"solveonce_reports_absorbed_total":                                    2,
		"solveonce_submits_upstream_total":                                    3,
		"solveonce_method_submits_total{family=userrecaptcha,outcome=shared}": 0,
	})

	// Counters are read when scraped, not when registered.
	st.SubmitsShared.Add(10)
	st.Family("userrecaptcha").Shared.Add(10)
	got = gather(t, reg)
	expect(t, got, map[string]float64{
		"solveonce_submits_saved_total":             16,
		"solveonce_money_saved_total{currency=EUR}": 0.036, // + 10 userrecaptcha at 3/1000
	})

	if err := Register(reg, Sources{Intercept: st}); err == nil {
		t.Error("registering the same metrics twice: want an error")
	}
}

func TestRegisterSkipsNilSources(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, Sources{}); err != nil {
		t.Fatal(err)
	}
	if got := gather(t, reg); len(got) != 0 {
		t.Fatalf("no sources, want no series; got %v", got)
	}
	var up upstream.Stats
	if err := Register(reg, Sources{Upstream: &up}); err != nil {
		t.Fatal(err)
	}
	for k := range gather(t, reg) {
		if strings.Contains(k, "client_") || strings.Contains(k, "breaker_state") {
			t.Errorf("unexpected series %s without its source", k)
		}
	}
}

func TestBreakerStateFollowsTheCircuit(t *testing.T) {
	c := breaker.New("test", breaker.Config{ConsecutiveFailures: 1, MinRequests: 1, OpenFor: time.Hour}, nil)
	reg := prometheus.NewPedanticRegistry()
	if err := Register(reg, Sources{Circuit: c}); err != nil {
		t.Fatal(err)
	}
	done, err := c.Allow()
	if err != nil {
		t.Fatal(err)
	}
	done(errors.New("boom"))
	expect(t, gather(t, reg), map[string]float64{
		"solveonce_breaker_state{state=open}":   1,
		"solveonce_breaker_state{state=closed}": 0,
		"solveonce_breaker_transitions_total":   1,
	})
}

func TestAttemptObserver(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	observe, err := AttemptObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	observe(upstream.Attempt{Kind: captchaai.KindSubmit, N: 1, HTTPStatus: 200, Class: "ok", Dur: 20 * time.Millisecond})
	observe(upstream.Attempt{Kind: captchaai.KindResult, N: 1, HTTPStatus: 502, Class: "http_5xx", Dur: time.Second})
	observe(upstream.Attempt{Kind: captchaai.KindResult, N: 2, HTTPStatus: 200, Class: "not_ready", Dur: time.Millisecond})
	observe(upstream.Attempt{Kind: captchaai.KindBalance, Class: ""})
	got := gather(t, reg)
	expect(t, got, map[string]float64{
		"solveonce_upstream_requests_total{class=ok,endpoint=in.php}":                        1,
		"solveonce_upstream_requests_total{class=http_5xx,endpoint=res.php}":                 1,
		"solveonce_upstream_requests_total{class=not_ready,endpoint=res.php}":                1,
		"solveonce_upstream_requests_total{class=unknown,endpoint=res.php}":                  1,
		"solveonce_upstream_attempt_duration_seconds_count{class=http_5xx,endpoint=res.php}": 1,
		"solveonce_upstream_attempt_duration_seconds_sum{class=http_5xx,endpoint=res.php}":   1,
	})
	if _, err := AttemptObserver(reg); err == nil {
		t.Error("second AttemptObserver on one registry: want an error")
	}
}

func TestSummarize(t *testing.T) {
	st, up := scripted()
	since := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	s := Summarize(Sources{
		Intercept: st,
		Upstream:  up,
		Circuit:   breaker.New("test", breaker.Config{}, nil),
		Prices:    Prices{Per1000: 2, Family: map[string]float64{"image": 0.5}},
	}, since, since.Add(90*time.Second))

	if s.Submissions != 10 || s.Deduplicated != 6 || s.SubmitsUpstream != 3 || s.SavingsPercent != 60 {
		t.Errorf("submissions: %+v", s)
	}
	if s.Polls != 20 || s.PollsAbsorbed != 15 || s.PollsUpstream != 5 {
		t.Errorf("polls: %+v", s)
	}
	// 6 saved submissions + 15 absorbed polls + 2 absorbed reports, of 33 requests.
	if s.UpstreamCallsAvoided != 23 || s.UpstreamCallsAvoidedPercent != 69.7 {
		t.Errorf("avoided: %d (%v%%)", s.UpstreamCallsAvoided, s.UpstreamCallsAvoidedPercent)
	}
	if s.MoneySaved != 0 || s.Currency != "USD" { // 6 image solves at 0.5/1000 = 0.003 → 0.00
		t.Errorf("money: %v %s", s.MoneySaved, s.Currency)
	}
	if s.UptimeSeconds != 90 || !s.Since.Equal(since) {
		t.Errorf("since/uptime: %v %v", s.Since, s.UptimeSeconds)
	}
	if len(s.Methods) != 2 || s.Methods[0].Method != "image" || s.Methods[0].Submissions != 8 ||
		s.Methods[0].Deduplicated != 6 || s.Methods[0].SavingsPercent != 75 || s.Methods[1].Method != "userrecaptcha" {
		t.Errorf("methods: %+v", s.Methods)
	}
	if s.Upstream == nil || s.Upstream.Attempts != 10 || s.Upstream.Breaker != "closed" {
		t.Errorf("upstream: %+v", s.Upstream)
	}
	if s.Cache != nil {
		t.Errorf("cache without a source: %+v", s.Cache)
	}

	empty := Summarize(Sources{}, since, since)
	if empty.SavingsPercent != 0 || empty.Methods == nil {
		t.Errorf("empty summary: %+v", empty)
	}
}

func TestMoneySavedIsExactAndMonotonic(t *testing.T) {
	var st intercept.Stats
	p := Prices{Per1000: 0.7, Family: map[string]float64{"a": 0.1, "b": 0.3}}
	prev := 0.0
	for i := range 3000 {
		fam := []string{"a", "b", "c", "d"}[i%4]
		st.Family(fam).Shared.Add(1)
		m := moneySaved(&st, p)
		if m < prev {
			t.Fatalf("money saved went down: %v after %v", m, prev)
		}
		prev = m
	}
	// 750 solves each of a, b at 0.1, 0.3 and of c, d at 0.7 per 1,000.
	if want := 0.75 * (0.1 + 0.3 + 0.7 + 0.7); prev < want-1e-9 || prev > want+1e-9 {
		t.Fatalf("money saved = %v, want %v", prev, want)
	}
}
