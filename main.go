// Command solveonce is a proxy in front of the CaptchaAI API that makes
// every CAPTCHA cost money once: identical submissions share one task and
// polls are answered from memory. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/pingback"
	"github.com/solveonce/solveonce/proxy"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "solveonce:", err)
		os.Exit(1)
	}
}

// subcommands run instead of the proxy: `solveonce ca`, `solveonce
// healthcheck`, … Each registers itself from its own file.
var subcommands = map[string]func(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error{}

// options are the command-line flags; they win over environment and file.
type options struct {
	configPath string
	listen     string
	upstream   string
	caCert     string
	caKey      string
	admin      string
}

func parseFlags(args []string, environ []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("solveonce", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.configPath, "config", lookupEnv(environ, "SOLVEONCE_CONFIG"), "TOML configuration `file` (env SOLVEONCE_CONFIG)")
	fs.StringVar(&o.listen, "listen", "", "proxy listen `address`, e.g. 127.0.0.1:8080 (config proxy.listen)")
	fs.StringVar(&o.upstream, "upstream", "", "CaptchaAI base `URL`, e.g. https://ocr.captchaai.com (config upstream.base_url)")
	fs.StringVar(&o.caCert, "ca-cert", "", "MITM CA certificate `file`, created when absent (config proxy.ca_cert)")
	fs.StringVar(&o.caKey, "ca-key", "", "MITM CA private key `file`, created with mode 0600 when absent (config proxy.ca_key)")
	fs.StringVar(&o.admin, "admin", "", "admin listen `address` for /metrics, /healthz, /readyz, /stats, e.g. 127.0.0.1:9090; \"off\" disables it (config admin.listen)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: solveonce [flags]            run the proxy")
		fmt.Fprintln(stderr, "       solveonce ca [flags]         print the MITM CA certificate (PEM)")
		fmt.Fprintln(stderr, "       solveonce dlq list|replay|drop [flags] pingback dead-letter queue")
		fmt.Fprintln(stderr, "       solveonce healthcheck [flags] exit 0 when the running proxy is healthy")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// loadConfig applies defaults, file, environment and flags, in that order
// of increasing precedence, and validates the result.
func loadConfig(o options, environ []string) (config.File, error) {
	f, err := config.Load(o.configPath, environ)
	if err != nil {
		return f, err
	}
	if o.listen != "" {
		f.Proxy.Listen = o.listen
	}
	if o.upstream != "" {
		f.Upstream.BaseURL = o.upstream
	}
	if o.caCert != "" {
		f.Proxy.CACert = o.caCert
	}
	if o.caKey != "" {
		f.Proxy.CAKey = o.caKey
	}
	if o.admin != "" {
		f.Admin.Listen = o.admin
	}
	return f, f.Validate()
}

// configure parses the flags in args and loads the configuration they
// name. help is true when the user asked for -h (nothing more to do).
func configure(args, environ []string, stderr io.Writer) (cfg config.File, help bool, err error) {
	o, err := parseFlags(args, environ, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, true, nil
		}
		return cfg, false, err
	}
	cfg, err = loadConfig(o, environ)
	return cfg, false, err
}

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		if cmd, ok := subcommands[args[0]]; ok {
			return cmd(ctx, args[1:], environ, stdout, stderr)
		}
	}
	cfg, help, err := configure(args, environ, stderr)
	if help || err != nil {
		return err
	}
	log := newLogger(cfg.Log, stderr)
	app, err := build(cfg, environ, log)
	if err != nil {
		return err
	}
	defer app.close()

	ln, err := net.Listen("tcp", cfg.Proxy.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return app.serve(ctx, ln, stdout)
}

// app is solveonce wired together.
type app struct {
	cfg     config.File
	pings   *pingback.Service // nil when pingback.enabled = false
	up      *upstream.Client
	log     *slog.Logger
	layer   *intercept.Layer
	answers *cache.Answers
	index   store.Index
	handler http.Handler
	closers []func()
}

func build(cfg config.File, environ []string, log *slog.Logger) (*app, error) {
	resolveDataDir(&cfg, environ) // ca.go: data_dir default; the proxy's CA files default to it
	a := &app{cfg: cfg, log: log}
	answers, err := cache.New(cfg.Cache)
	if err != nil {
		return nil, err
	}
	a.answers = answers
	a.closers = append(a.closers, answers.Close)

	var answerCache intercept.AnswerCache = answers // replicas share answers through Redis too
	switch cfg.Store.Kind {
	case "redis": // see redis.go
		rs, err := newRedisStore(cfg, environ, answers, log)
		if err != nil {
			return nil, err
		}
		a.index, answerCache = rs.Failover, rs.Cache
		a.closers = append(a.closers, rs.close)
	default:
		a.index = store.NewMemory(cfg.Store.Memory)
	}

	// The upstream client logs every breaker transition itself.
	circuit := breaker.New("captchaai", cfg.Breaker, upstream.IsFailure)
	var rt http.RoundTripper // nil: upstream's default transport (direct, TLS verified)
	parentFn, err := proxy.ParentProxyFunc(cfg.Proxy)
	if err != nil {
		return nil, err
	}
	if parentFn != nil { // proxy.parent_proxy_upstream: CaptchaAI calls via the parent proxy too
		tr := upstream.NewTransport(cfg.Upstream.MaxInFlight)
		tr.Proxy = parentFn
		rt = tr
	}
	up, err := upstream.New(cfg.Upstream, circuit, rt)
	if err != nil {
		return nil, err
	}
	up.Logger = log
	a.up = up
	iopts := []intercept.Option{intercept.WithLogger(log)}
	if cfg.Pingback.Enabled {
		pb, err := pingback.New(cfg.Pingback, cfg.DataDir, pingback.WithLogger(log))
		if err != nil {
			return nil, err
		}
		a.pings = pb
		iopts = append(iopts, intercept.WithPingbacks(pb))
		a.closers = append(a.closers, func() { // a no-op after serve's Shutdown
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = pb.Shutdown(ctx)
		})
	}
	a.layer = intercept.New(cfg.Intercept, up, answerCache, a.index, iopts...)
	if a.pings != nil {
		a.pings.Start(a.layer)
	}
	srv, err := proxy.New(cfg.Proxy, proxy.NewCaptcha(a.layer, cfg.Proxy.MaxBody), log)
	if err != nil {
		return nil, err
	}
	a.handler = srv
	a.closers = append(a.closers, func() { _ = srv.Close() })
	return a, nil
}

// serve runs the proxy on ln (and the admin listener, see admin.go) until
// ctx is done, then shuts down gracefully within shutdown_timeout: report
// not ready, stop accepting, let in-flight requests and shared upstream
// calls finish, stop the admin listener.
func (a *app) serve(ctx context.Context, ln net.Listener, stdout io.Writer) error {
	adm, err := a.startAdmin()
	if err != nil {
		_ = ln.Close()
		return err
	}
	hs := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	a.log.Info("solveonce listening", "addr", ln.Addr().String(), "upstream", a.cfg.Upstream.BaseURL, "store", a.cfg.Store.Kind)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	adm.setServing(true)
	select {
	case err := <-errc:
		actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = adm.shutdown(actx)
		acancel()
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	adm.setServing(false)
	a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
	defer cancel()
	err = hs.Shutdown(sctx)
	if err != nil {
		_ = hs.Close()
	}
	// Connections the proxy took over (MITM, tunnels) are not hs's.
	if sh, ok := a.handler.(interface{ Shutdown(context.Context) error }); ok {
		if serr := sh.Shutdown(sctx); err == nil {
			err = serr
		}
	}
	if a.pings != nil {
		pctx, pcancel := context.WithTimeout(sctx, a.cfg.Pingback.Timeout+time.Second)
		if perr := a.pings.Shutdown(pctx); err == nil {
			err = perr
		}
		pcancel()
	}
	if werr := a.layer.Wait(sctx); err == nil {
		err = werr
	}
	<-errc
	if aerr := adm.shutdown(sctx); err == nil {
		err = aerr
	}
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	a.log.Info("stopped")
	return nil
}

func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
}

func newLogger(c config.Log, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(environ[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}
