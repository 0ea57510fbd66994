package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/solveonce/solveonce/admin"
	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/metrics"
	"github.com/solveonce/solveonce/store"
)

func init() { subcommands["healthcheck"] = healthcheck }

// adminListenOff is the admin.listen value that disables the admin
// listener.
const adminListenOff = "off"

// adminServer is the admin listener of a running app; the zero value (the
// listener is off) does nothing.
type adminServer struct {
	srv  *admin.Server
	hs   *http.Server
	errc chan error
}

// startAdmin exports the app's counters on a private Prometheus registry,
// instruments the upstream client, and serves the admin endpoints on
// admin.listen, unless it is "off". Call it before the proxy accepts
// requests: it sets upstream.Client.Observe.
func (a *app) startAdmin() (*adminServer, error) {
	if a.cfg.Admin.Listen == adminListenOff {
		return &adminServer{}, nil
	}
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
	}
	src := a.metricSources()
	if err := metrics.Register(reg, src); err != nil {
		return nil, err
	}
	if a.up != nil && a.up.Observe == nil {
		observe, err := metrics.AttemptObserver(reg)
		if err != nil {
			return nil, err
		}
		a.up.Observe = observe
	}
	started := time.Now()
	srv := admin.New(admin.Config{
		Gatherer: reg,
		Summary:  func() metrics.Summary { return metrics.Summarize(src, started, time.Now()) },
		Checks:   a.readinessChecks(),
		Log:      a.log,
	})

	ln, err := net.Listen("tcp", a.cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	as := &adminServer{
		srv: srv,
		hs: &http.Server{
			Handler:           srv,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		},
		errc: make(chan error, 1),
	}
	go func() { as.errc <- as.hs.Serve(ln) }()
	a.log.Info("admin listening", "addr", ln.Addr().String(), "endpoints", "/metrics /healthz /readyz /stats /")
	return as, nil
}

// setServing tells readiness whether the proxy accepts requests.
func (as *adminServer) setServing(on bool) {
	if as.srv != nil {
		as.srv.SetServing(on)
	}
}

// shutdown stops the admin listener, letting scrapes in progress finish
// within ctx.
func (as *adminServer) shutdown(ctx context.Context) error {
	if as.hs == nil {
		return nil
	}
	err := as.hs.Shutdown(ctx)
	if err != nil {
		_ = as.hs.Close()
	}
	<-as.errc
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	return nil
}

// Optional counters that other packages may provide; metricSources wires
// each one the running app's components implement.
type (
	trackedTasker interface{ TrackedTasks() int64 }          // intercept.Layer: tasks tracked
	certCounter   interface{ CertificatesGenerated() int64 } // proxy.Server: MITM leaves signed
	degrader      interface{ Degraded() bool }               // store.Index: running on a fallback
)

// metricSources collects the counters of a's components.
func (a *app) metricSources() metrics.Sources {
	m := a.cfg.Metrics
	src := metrics.Sources{
		Intercept: &a.layer.Stats,
		Cache:     a.answers,
		Prices:    metrics.Prices{Currency: m.Currency, Per1000: m.PricePer1000, Family: m.Prices},
	}
	if a.up != nil {
		src.Upstream = &a.up.Stats
		src.Circuit = a.up.Circuit()
	}
	if t, ok := any(a.layer).(trackedTasker); ok {
		src.TrackedTasks = t.TrackedTasks
	}
	if c, ok := a.handler.(certCounter); ok {
		src.Certificates = c.CertificatesGenerated
	}
	if d, ok := a.index.(degrader); ok {
		src.StoreDegraded = d.Degraded
	}
	if f, ok := a.index.(*store.Failover); ok {
		src.StoreFailover = &f.Stats
	}
	return src
}

// readinessChecks are what /readyz asks besides "the proxy is serving":
// the submission index must answer (solveonce cannot deduplicate safely
// without it); an open circuit or a store on its fallback is reported as
// degraded, not as unready, because solveonce still answers from memory
// and fails fast in the protocol's words.
func (a *app) readinessChecks() []admin.Check {
	checks := []admin.Check{{Name: "store", Func: a.checkStore}}
	if a.up != nil {
		c := a.up.Circuit()
		checks = append(checks, admin.Check{Name: "upstream circuit", Func: func(context.Context) error {
			switch c.State() {
			case breaker.Open:
				return admin.Degraded("open: CaptchaAI is failing; answers come from the cache and new work is refused with retry-later answers")
			case breaker.HalfOpen:
				return admin.Degraded("half-open: probing whether CaptchaAI has recovered")
			}
			return nil
		}})
	}
	return checks
}

// checkStore is the store's readiness: the submission index answers. An
// index that failed over to a local fallback (store.Failover) still
// answers, but the shared store behind it does not; both that and a plain
// unreachable index fail readiness when admin.ready_requires_store is set,
// and are reported as degraded otherwise (intercept then deduplicates
// within this replica).
func (a *app) checkStore(ctx context.Context) error {
	var problem error
	if d, ok := a.index.(degrader); ok && d.Degraded() {
		problem = errors.New("primary unreachable, serving from the local fallback")
		if e, ok := a.index.(interface{ Err() error }); ok && e.Err() != nil {
			problem = fmt.Errorf("%w: %w", problem, e.Err())
		}
	} else if err := a.index.Ping(ctx); err != nil {
		problem = fmt.Errorf("unreachable: %w", err)
	}
	switch {
	case problem == nil:
		return nil
	case a.cfg.Admin.ReadyRequiresStore:
		return fmt.Errorf("%s store %w", a.cfg.Store.Kind, problem)
	default:
		return admin.Degraded("%s store %v; deduplicating within this replica only", a.cfg.Store.Kind, problem)
	}
}

// healthcheckTimeout bounds `solveonce healthcheck`.
const healthcheckTimeout = 2 * time.Second

// healthcheck is `solveonce healthcheck [flags]`: it reads the same
// configuration and flags as the proxy (-config, -admin, SOLVEONCE_*),
// asks the admin listener's /healthz, and fails unless it answers 200
// within 2 seconds. It is the container's HEALTHCHECK (the runtime image
// has no shell or curl).
func healthcheck(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg, help, err := configure(args, environ, stderr)
	if help || err != nil {
		return err
	}
	if cfg.Admin.Listen == adminListenOff {
		return errors.New("healthcheck: admin.listen is \"off\": there is no endpoint to ask")
	}
	addr, err := dialAddr(cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	url := "http://" + addr + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	// No proxy from the environment: a sidecar's HTTP_PROXY may well be
	// solveonce itself.
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", url, resp.Status)
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

// dialAddr turns a listen address into one to connect to: a wildcard or
// empty host becomes loopback.
func dialAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("admin.listen %q: %w", listen, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port), nil
}
