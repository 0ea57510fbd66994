// Package admin serves solveonce's admin endpoints, on a listener of their
// own so that the proxy port never exposes them:
//
//	/metrics  Prometheus exposition of a private registry
//	/healthz  liveness: 200 "ok" while the process answers
//	/readyz   readiness: 200 when the proxy is serving and every check
//	          passes, 503 otherwise; degraded states are listed in the body
//	/stats    the savings report (metrics.Summary) as JSON
//	/         a small human status page of the same figures
//
// The handler only reads: counters through the gatherer and the summary
// function, readiness through the checks. It never sees a request of the
// proxy, so it cannot leak an API key.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/solveonce/solveonce/metrics"
)

// DefaultCheckTimeout bounds every readiness check when Config.CheckTimeout
// is zero.
const DefaultCheckTimeout = 2 * time.Second

// Config says what the admin endpoints show.
type Config struct {
	// Gatherer is scraped by /metrics; nil serves 404 there.
	Gatherer prometheus.Gatherer
	// Summary returns the savings report for /stats and the status page;
	// nil serves 404 on /stats and an empty page.
	Summary func() metrics.Summary
	// Checks decide readiness, in order. See Check.
	Checks []Check
	// CheckTimeout bounds each check; 0 means DefaultCheckTimeout.
	CheckTimeout time.Duration
	// Log receives errors writing responses; nil means slog.Default().
	Log *slog.Logger
}

// Check is one readiness condition.
type Check struct {
	// Name labels the check in /readyz and on the status page.
	Name string
	// Func returns nil when all is well, an error made by Degraded when
	// solveonce still serves but worse than it should (reported, ready),
	// and any other error when solveonce must not receive traffic (not
	// ready). It runs under a context bounded by Config.CheckTimeout.
	Func func(ctx context.Context) error
}

// DegradedError marks a readiness check result as degraded but ready.
type DegradedError struct{ Reason string }

func (e *DegradedError) Error() string { return "degraded: " + e.Reason }

// Degraded returns a *DegradedError with the formatted reason.
func Degraded(format string, a ...any) error {
	return &DegradedError{Reason: fmt.Sprintf(format, a...)}
}

// Status is one check's verdict.
type Status string

// The verdicts of a check.
const (
	StatusOK       Status = "ok"
	StatusDegraded Status = "degraded"
	StatusFailing  Status = "failing"
)

// CheckResult is the outcome of one check.
type CheckResult struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Readiness is the outcome of all checks.
type Readiness struct {
	Ready  bool          `json:"ready"`
	Checks []CheckResult `json:"checks"`
}

// Server is the admin http.Handler. Create it with New; it is safe for
// concurrent use.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	serving atomic.Bool
	metrics http.Handler
}

// New returns an admin handler for cfg. It reports not ready until
// SetServing(true).
func New(cfg Config) *Server {
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = DefaultCheckTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	if cfg.Gatherer != nil {
		s.metrics = promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorHandling:       promhttp.ContinueOnError,
			MaxRequestsInFlight: 4,
			Timeout:             10 * time.Second,
		})
	}
	s.mux.HandleFunc("GET /metrics", s.serveMetrics)
	s.mux.HandleFunc("GET /healthz", s.serveHealthz)
	s.mux.HandleFunc("GET /readyz", s.serveReadyz)
	s.mux.HandleFunc("GET /stats", s.serveStats)
	s.mux.HandleFunc("GET /{$}", s.serveStatus)
	return s
}

// SetServing says whether the proxy accepts requests: true once its
// listener serves, false as soon as a shutdown begins, so that load
// balancers stop sending traffic while in-flight requests drain.
func (s *Server) SetServing(on bool) { s.serving.Store(on) }

// ServeHTTP serves the admin endpoints (GET and HEAD only).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// Readiness runs the checks. The proxy not serving is itself a failing
// check, named "serving".
func (s *Server) Readiness(ctx context.Context) Readiness {
	rd := Readiness{Ready: true, Checks: make([]CheckResult, 0, len(s.cfg.Checks)+1)}
	if s.serving.Load() {
		rd.Checks = append(rd.Checks, CheckResult{Name: "serving", Status: StatusOK})
	} else {
		rd.Ready = false
		rd.Checks = append(rd.Checks, CheckResult{Name: "serving", Status: StatusFailing, Detail: "proxy not accepting requests (starting or shutting down)"})
	}
	for _, c := range s.cfg.Checks {
		res := s.run(ctx, c)
		if res.Status == StatusFailing {
			rd.Ready = false
		}
		rd.Checks = append(rd.Checks, res)
	}
	return rd
}

func (s *Server) run(ctx context.Context, c Check) CheckResult {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CheckTimeout)
	defer cancel()
	err := c.Func(ctx)
	var d *DegradedError
	switch {
	case err == nil:
		return CheckResult{Name: c.Name, Status: StatusOK}
	case errors.As(err, &d):
		return CheckResult{Name: c.Name, Status: StatusDegraded, Detail: d.Reason}
	default:
		return CheckResult{Name: c.Name, Status: StatusFailing, Detail: err.Error()}
	}
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if s.metrics == nil {
		http.NotFound(w, r)
		return
	}
	s.metrics.ServeHTTP(w, r)
}

func (s *Server) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	s.write(w, []byte("ok\n"))
}

// serveReadyz answers 200 or 503 with one line per check:
//
//	ready
//	serving: ok
//	store: ok
//	upstream circuit: degraded: open: CaptchaAI failing; …
//
// ?format=json returns the Readiness as JSON instead.
func (s *Server) serveReadyz(w http.ResponseWriter, r *http.Request) {
	rd := s.Readiness(r.Context())
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	if r.URL.Query().Get("format") == "json" {
		s.writeJSON(w, code, rd)
		return
	}
	var b strings.Builder
	if rd.Ready {
		b.WriteString("ready\n")
	} else {
		b.WriteString("not ready\n")
	}
	for _, c := range rd.Checks {
		b.WriteString(c.Name + ": " + string(c.Status))
		if c.Detail != "" {
			b.WriteString(": " + oneLine(c.Detail))
		}
		b.WriteByte('\n')
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	s.write(w, []byte(b.String()))
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Summary == nil {
		http.NotFound(w, r)
		return
	}
	s.writeJSON(w, http.StatusOK, s.cfg.Summary())
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		s.cfg.Log.Error("admin: encoding JSON", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	s.write(w, append(b, '\n'))
}

func (s *Server) write(w http.ResponseWriter, b []byte) {
	if _, err := w.Write(b); err != nil {
		s.cfg.Log.Debug("admin: writing response", "err", err)
	}
}

// oneLine keeps a check's detail on its line of /readyz.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
