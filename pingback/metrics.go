package pingback

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Collectors returns Prometheus collectors for the Service's counters and
// gauges, named <namespace>_pingback_…: register them on the admin
// registry. They read the counters at scrape time.
func (s *Service) Collectors(namespace string) []prometheus.Collector {
	counter := func(name, help string, c *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Subsystem: "pingback", Name: name, Help: help},
			func() float64 { return float64(c.Load()) })
	}
	labelled := func(name, help, label, value string, c *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Subsystem: "pingback", Name: name, Help: help,
			ConstLabels: prometheus.Labels{label: value}}, func() float64 { return float64(c.Load()) })
	}
	const subHelp = "Pingbacks of merged submissions, by result: accepted (solveonce delivers it), duplicate (same task and URL already served), refused (pingback.allow)."
	const delHelp = "Pingback subscribers settled, by result: delivered, dead_lettered (to the dead-letter queue), replayed (delivered by `solveonce dlq replay`; also counted as delivered)."
	return []prometheus.Collector{
		labelled("subscriptions_total", subHelp, "result", "accepted", &s.Stats.Subscribed),
		labelled("subscriptions_total", subHelp, "result", "duplicate", &s.Stats.Duplicates),
		labelled("subscriptions_total", subHelp, "result", "refused", &s.Stats.Refused),
		labelled("deliveries_total", delHelp, "result", "delivered", &s.Stats.Delivered),
		labelled("deliveries_total", delHelp, "result", "dead_lettered", &s.Stats.DeadLettered),
		labelled("deliveries_total", delHelp, "result", "replayed", &s.Stats.Replayed),
		counter("queue_overflows_total", "Pingback subscribers dead-lettered at once because pingback.queue was full.", &s.Stats.Overflows),
		counter("attempts_total", "Pingback delivery attempts.", &s.Stats.Attempts),
		counter("retries_total", "Failed pingback delivery attempts scheduled to be tried again.", &s.Stats.Retries),
		counter("polls_total", "Answer polls made for pingback subscribers (through the answer cache and shared polls).", &s.Stats.Polls),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "pingback", Name: "pending",
			Help: "Pingback subscribers waiting for an answer or a delivery."},
			func() float64 { return float64(s.Held()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "pingback", Name: "dead_letters",
			Help: "Entries in the pingback dead-letter queue (see `solveonce dlq list`)."},
			func() float64 { return float64(s.DeadLetters()) }),
	}
}
