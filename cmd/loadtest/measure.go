package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// sample is the outcome of one measured attack on one target.
type sample struct {
	requests   uint64
	throughput float64 // successful answers per second
	p50        time.Duration
	p90        time.Duration
	p99        time.Duration
	max        time.Duration
	errors     uint64   // transport errors, non-2xx and wrong answers
	errSamples []string // a few distinct error messages

	clientSubmits, clientPolls uint64
	upstream                   counters
	haveUpstream               bool
}

// table is the median of every target's samples at one rate.
type table struct {
	scenario string
	rate     int // requests/s asked for; 0 at max
	rows     []sample
	names    []string
}

func (t *table) row(name string) (sample, bool) {
	if i := slices.Index(t.names, name); i >= 0 {
		return t.rows[i], true
	}
	return sample{}, false
}

// measure attacks every target at rate, o.repeat times (the order of the
// targets rotating between rounds), and returns the medians.
func measure(ctx context.Context, o options, e *environment, sc *scenario, rate rateSpec) (*table, error) {
	samples := map[string][]sample{}
	for round := range o.repeat {
		order := slices.Clone(e.targets)
		k := round % len(order)
		order = append(order[k:], order[:k]...)
		for _, t := range order {
			attack := fmt.Sprintf("%s-%s-%d-%d", t.name, rate, round, time.Now().UnixNano())
			if o.warmup > 0 {
				if _, err := runAttack(ctx, o, e, sc, t, rate, o.warmup, attack+"-warmup"); err != nil {
					return nil, err
				}
			}
			s, err := runAttack(ctx, o, e, sc, t, rate, o.duration, attack)
			if err != nil {
				return nil, err
			}
			samples[t.name] = append(samples[t.name], s)
		}
	}
	tbl := &table{scenario: sc.name, rate: rate.perSec}
	for _, t := range e.targets {
		tbl.names = append(tbl.names, t.name)
		tbl.rows = append(tbl.rows, median(samples[t.name]))
	}
	return tbl, nil
}

// runAttack runs one vegeta attack on t for d and summarises it.
func runAttack(ctx context.Context, o options, e *environment, sc *scenario, t *target, rate rateSpec, d time.Duration, attack string) (sample, error) {
	if err := ctx.Err(); err != nil {
		return sample{}, fmt.Errorf("load test stopped: %w", err)
	}
	conns := max(o.workers, o.maxWorkers, 64)
	client := t.client(o.timeout, conns)
	defer client.CloseIdleConnections()
	opts := []func(*vegeta.Attacker){vegeta.Client(client), vegeta.Redirects(vegeta.NoFollow)}
	pacer := vegeta.ConstantPacer{Freq: rate.perSec, Per: time.Second}
	if rate.max {
		pacer = vegeta.ConstantPacer{} // as fast as the workers go
		opts = append(opts, vegeta.Workers(uint64(o.workers)), vegeta.MaxWorkers(uint64(o.workers)))
	} else {
		// vegeta adds a worker (and a connection) whenever all are busy at
		// a tick; bound them, so that an overloaded target slows the
		// attack down (and is flagged) instead of drowning the machine in
		// connections.
		opts = append(opts, vegeta.Workers(uint64(min(o.workers, o.maxWorkers, rate.perSec))), vegeta.MaxWorkers(uint64(o.maxWorkers)))
	}
	atk := vegeta.NewAttacker(opts...)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()

	before, okBefore := e.upstreamCounts(ctx, t)
	targeter, observe := sc.targeter(t, attack)
	var m vegeta.Metrics
	s := sample{}
	seen := map[string]bool{}
	for r := range atk.Attack(targeter, pacer, d, attack) {
		bad := r.Error != "" || r.Code < 200 || r.Code >= 300 || !sc.ok(r)
		if bad {
			// Count it as a failure in the metrics too (vegeta counts
			// only transport errors and HTTP status).
			s.errors++
			msg := r.Error
			if msg == "" {
				msg = fmt.Sprintf("HTTP %d %q", r.Code, truncate(r.Body, 60))
			}
			if len(s.errSamples) < 3 && !seen[msg] {
				seen[msg] = true
				s.errSamples = append(s.errSamples, msg)
			}
			if r.Error == "" {
				r.Code = 0
				r.Error = "wrong answer"
			}
		}
		if r.Method == http.MethodPost {
			s.clientSubmits++
		} else {
			s.clientPolls++
		}
		m.Add(r)
		if observe != nil {
			observe(r)
		}
	}
	m.Close()
	if err := ctx.Err(); err != nil {
		return sample{}, fmt.Errorf("load test stopped: %w", err)
	}
	after, okAfter := e.upstreamCounts(ctx, t)
	s.requests = m.Requests
	s.throughput = m.Throughput
	s.p50, s.p90, s.p99, s.max = m.Latencies.P50, m.Latencies.P90, m.Latencies.P99, m.Latencies.Max
	if okBefore && okAfter {
		s.upstream, s.haveUpstream = after.sub(before), true
	}
	return s, nil
}

// median returns, field by field, the median of ss (the lower middle for
// an even count); error samples come from all of them.
func median(ss []sample) sample {
	if len(ss) == 0 {
		return sample{}
	}
	mid := func(get func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = get(s)
		}
		sort.Float64s(v)
		return v[(len(v)-1)/2]
	}
	dur := func(get func(sample) time.Duration) time.Duration {
		return time.Duration(mid(func(s sample) float64 { return float64(get(s)) }))
	}
	out := sample{
		requests:      uint64(mid(func(s sample) float64 { return float64(s.requests) })),
		throughput:    mid(func(s sample) float64 { return s.throughput }),
		p50:           dur(func(s sample) time.Duration { return s.p50 }),
		p90:           dur(func(s sample) time.Duration { return s.p90 }),
		p99:           dur(func(s sample) time.Duration { return s.p99 }),
		max:           dur(func(s sample) time.Duration { return s.max }),
		errors:        uint64(mid(func(s sample) float64 { return float64(s.errors) })),
		clientSubmits: uint64(mid(func(s sample) float64 { return float64(s.clientSubmits) })),
		clientPolls:   uint64(mid(func(s sample) float64 { return float64(s.clientPolls) })),
		haveUpstream:  true,
	}
	for _, s := range ss {
		out.haveUpstream = out.haveUpstream && s.haveUpstream
		for _, e := range s.errSamples {
			if len(out.errSamples) < 3 && !slices.Contains(out.errSamples, e) {
				out.errSamples = append(out.errSamples, e)
			}
		}
	}
	if out.haveUpstream {
		out.upstream = counters{
			Requests:       int64(mid(func(s sample) float64 { return float64(s.upstream.Requests) })),
			SubmitRequests: int64(mid(func(s sample) float64 { return float64(s.upstream.SubmitRequests) })),
			Submits:        int64(mid(func(s sample) float64 { return float64(s.upstream.Submits) })),
			Polls:          int64(mid(func(s sample) float64 { return float64(s.upstream.Polls) })),
		}
	}
	return out
}

// print writes the table and solveonce's ratios to the baselines.
func (t *table) print(w io.Writer, rate string) {
	fmt.Fprintf(w, "\nrate %s\n", rate)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	overloaded := false
	fmt.Fprintln(tw, "target\trequests\tthroughput/s\tp50\tp90\tp99\tmax\terrors\tclient in.php/res.php\tupstream in.php/res.php\t")
	for i, name := range t.names {
		s := t.rows[i]
		up := "n/a"
		if s.haveUpstream {
			up = fmt.Sprintf("%d/%d", s.upstream.SubmitRequests, s.upstream.Requests-s.upstream.SubmitRequests)
		}
		mark := ""
		if t.overloaded(s) {
			mark, overloaded = "*", true
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%s\t%s\t%s\t%s\t%s\t%d\t%d/%d\t%s\t\n",
			name, s.requests, s.throughput, mark, ms(s.p50), ms(s.p90), ms(s.p99), ms(s.max), s.errors, s.clientSubmits, s.clientPolls, up)
	}
	_ = tw.Flush()
	if overloaded {
		fmt.Fprintf(w, "* did not sustain %d/s (below 95%%): the machine (attacker and servers together) was saturated; latencies include queueing\n", t.rate)
	}
	for i, name := range t.names {
		for _, e := range t.rows[i].errSamples {
			fmt.Fprintf(w, "  %s error: %s\n", name, e)
		}
	}
	so, ok := t.row(targetSolveonce)
	if !ok {
		return
	}
	if so.haveUpstream && t.scenario == "mix" {
		fmt.Fprintf(w, "savings: solveonce sent %d of %d submissions and %d of %d other requests upstream (%s of all requests avoided)\n",
			so.upstream.SubmitRequests, so.clientSubmits, so.upstream.Requests-so.upstream.SubmitRequests, so.clientPolls,
			pct(1-float64(so.upstream.Requests)/float64(max(1, so.clientSubmits+so.clientPolls))))
	}
	for i, name := range t.names {
		if name == targetSolveonce {
			continue
		}
		b := t.rows[i]
		fmt.Fprintf(w, "solveonce vs %-9s throughput %5.2fx   p99 %5.2fx (%+.2fms)\n",
			name+":", ratio(so.throughput, b.throughput), ratio(float64(so.p99), float64(b.p99)), float64(so.p99-b.p99)/1e6)
	}
}

// overloaded reports whether s fell short of its fixed rate.
func (t *table) overloaded(s sample) bool {
	if t.rate <= 0 || s.requests == 0 {
		return false
	}
	return s.throughput < 0.95*float64(t.rate)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

func pct(f float64) string { return fmt.Sprintf("%.1f%%", f*100) }

func truncate(b []byte, n int) string {
	s := string(b)
	if len(s) > n {
		return s[:n] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
