package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/solveonce/solveonce/upstream"
)

// AttemptObserver registers the upstream attempt metrics on reg and returns
// the function to set as upstream.Client.Observe: a counter of HTTP
// exchanges with CaptchaAI and a histogram of their duration, both by
// endpoint ("in.php", "res.php", "other") and outcome class ("ok",
// "not_ready", "http_5xx", "timeout", …; see upstream.Attempt.Class). It
// never blocks and never looks at the request, so no key can leak into a
// label.
func AttemptObserver(reg prometheus.Registerer) (func(upstream.Attempt), error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "upstream_requests_total",
		Help:      "HTTP exchanges with CaptchaAI (first tries and retries), by endpoint and outcome class.",
	}, []string{"endpoint", "class"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace,
		Name:      "upstream_attempt_duration_seconds",
		Help:      "Duration of one HTTP exchange with CaptchaAI (waits for limits excluded), by endpoint and outcome class.",
		Buckets:   []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"endpoint", "class"})
	for _, c := range []prometheus.Collector{requests, latency} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register upstream attempts: %w", err)
		}
	}
	return func(a upstream.Attempt) {
		ep, class := a.Kind.Endpoint(), a.Class
		if class == "" {
			class = "unknown"
		}
		requests.WithLabelValues(ep, class).Inc()
		latency.WithLabelValues(ep, class).Observe(a.Dur.Seconds())
	}, nil
}
