package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/elazarl/goproxy"
)

// Stats counts forward-proxy traffic; read the fields with Load.
type Stats struct {
	Intercepted  atomic.Int64 // CaptchaAI requests answered in forward-proxy mode (plain and MITM)
	Tunnels      atomic.Int64 // CONNECT tunnels to other hosts opened
	Forwarded    atomic.Int64 // plain-http requests to other hosts forwarded
	Denied       atomic.Int64 // requests refused: other_hosts = "deny", ports, loops
	AuthFailures atomic.Int64 // 407 answers
}

// Server is the proxy front's http.Handler. Close or Shutdown it after the
// http.Server that runs it has shut down: connections taken over for
// tunnels and MITM are no longer the http.Server's.
type Server struct {
	// Stats counts forward-proxy traffic.
	Stats Stats

	cfg     Config
	captcha *Captcha
	log     *slog.Logger
	hosts   hostSet
	ports   []int
	auth    *basicAuth // nil: no authentication
	mitm    *mitm
	dial    *dialer
	tr      *http.Transport // plain http to other hosts
	gp      *goproxy.ProxyHttpServer

	closed atomic.Bool
	wg     sync.WaitGroup // tunnel splices

	mu    sync.Mutex // guards conns
	conns map[*trackedConn]struct{}
}

// New returns a Server answering CaptchaAI requests with captcha. It loads
// the MITM CA (creating it when its files are absent, refusing goproxy's
// bundled CA), and warns when cfg.Listen is beyond loopback without proxy
// authentication. Without CA files (no CACert/CAKey and no DataDir) it
// warns and runs with https interception off: such CONNECTs get 503.
func New(cfg Config, captcha *Captcha, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var ca *CA
	certFile, keyFile, err := cfg.CAFiles()
	if err != nil {
		log.Warn("https interception is off: CONNECT to an intercepted host gets 503", "why", err)
	} else if ca, err = LoadOrCreateCA(certFile, keyFile, log); err != nil {
		return nil, err
	}
	parent, err := parseParent(cfg.ParentProxy)
	if err != nil {
		return nil, fmt.Errorf("proxy.parent_proxy: %w", err)
	}
	if parent != nil {
		for _, scheme := range []string{"http", "https"} {
			pu, err := parent(&url.URL{Scheme: scheme, Host: "example.com"})
			if err == nil && pu != nil && sameEndpoint(cfg.Listen, parentAddr(pu)) {
				return nil, fmt.Errorf("proxy.parent_proxy: %s %w", pu.Redacted(), errParentLoop)
			}
		}
	}
	s := &Server{
		cfg:     cfg,
		captcha: captcha,
		log:     log,
		hosts:   newHostSet(cfg.InterceptHosts),
		ports:   slices.Clone(cfg.ConnectPorts),
		conns:   map[*trackedConn]struct{}{},
	}
	if cfg.AuthUser != "" {
		s.auth = newBasicAuth(cfg.AuthUser, cfg.AuthPassword)
	}
	if ca != nil {
		s.mitm = newMITM(ca, s.hosts)
	}
	s.dial = newDialer(parent, s.hosts)
	s.tr = s.dial.transport()
	s.gp = s.newGoproxy()

	if !isLoopbackAddr(cfg.Listen) && s.auth == nil {
		log.Warn("proxy listens beyond loopback without authentication: anyone who can reach it can use it as an open proxy; set proxy.auth_user and SOLVEONCE_PROXY_AUTH_PASSWORD, or listen on 127.0.0.1",
			"listen", cfg.Listen)
	}
	log.Info("forward-proxy mode ready", "intercept_hosts", cfg.InterceptHosts, "other_hosts", cfg.OtherHosts,
		"connect_ports", cfg.ConnectPorts, "parent_proxy", redactURL(cfg.ParentProxy), "auth", s.auth != nil, "ca_cert", certFile)
	return s, nil
}

// newGoproxy builds the goproxy engine behind forward-proxy mode, with
// every default that is unsafe for us replaced: a verifying transport that
// never reads the environment, no environment CONNECT dialer, our own CA,
// quiet logging, and Accept-Encoding passed through untouched.
func (s *Server) newGoproxy() *goproxy.ProxyHttpServer {
	gp := goproxy.NewProxyHttpServer()
	gp.Verbose = false
	gp.Logger = goproxyLogger{s.log}
	gp.Tr = s.tr
	gp.ConnectDial = nil
	gp.ConnectDialWithReq = nil
	gp.KeepAcceptEncoding = true
	gp.NonproxyHandler = http.HandlerFunc(s.serveOrigin)
	gp.OnRequest().HandleConnectFunc(s.handleConnect)
	gp.OnRequest().DoFunc(s.onRequest)
	gp.OnResponse().DoFunc(s.onResponse)
	return gp
}

// ServeHTTP routes one request: origin-form requests are base-URL mode;
// absolute-form requests and CONNECT are forward-proxy mode.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect && !r.URL.IsAbs() {
		s.serveOrigin(w, r)
		return
	}
	if s.auth != nil && !s.auth.allow(r) {
		s.Stats.AuthFailures.Add(1)
		s.auth.challenge(w)
		return
	}
	if r.Method == http.MethodConnect {
		s.serveConnect(w, r)
		return
	}
	switch {
	case isSelf(r, r.URL.Host):
		// A client whose HTTP_PROXY is solveonce calling solveonce's own
		// base URL: answer it rather than loop.
		s.serveOrigin(w, r)
	case s.hosts.match(r.URL.Host):
		s.Stats.Intercepted.Add(1)
		s.log.Debug("intercepted", "scheme", r.URL.Scheme, "host", r.URL.Host, "path", r.URL.Path)
		s.captcha.ServeHTTP(w, r)
	case s.cfg.OtherHosts == OtherHostsDeny:
		s.deny(w, r, "other hosts are not served by this proxy")
	default:
		s.Stats.Forwarded.Add(1)
		s.gp.ServeHTTP(s.track(w, 0), r)
	}
}

// serveOrigin answers base-URL mode and the health endpoint.
func (s *Server) serveOrigin(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	default:
		// Everything else is CaptchaAI's business: understood requests are
		// deduplicated, the rest forwarded unchanged.
		s.captcha.ServeHTTP(w, r)
	}
}

// serveConnect decides a CONNECT: MITM for intercepted hosts (through
// goproxy), refusal, or a byte-for-byte tunnel.
func (s *Server) serveConnect(w http.ResponseWriter, r *http.Request) {
	target := r.URL.Host
	if target == "" {
		target = r.Host
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil || host == "" {
		http.Error(w, "CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	switch {
	case s.hosts.match(host) && s.mitm == nil:
		s.Stats.Denied.Add(1)
		http.Error(w, "solveonce: https interception is off: no MITM CA (set data_dir, or proxy.ca_cert and proxy.ca_key)", http.StatusServiceUnavailable)
	case s.hosts.match(host):
		s.log.Debug("intercepting tunnel", "host", target)
		st := &tunnelState{host: target}
		r = r.WithContext(context.WithValue(r.Context(), tunnelKey{}, st))
		s.gp.ServeHTTP(s.trackTunnel(w, st), r)
	case s.cfg.OtherHosts == OtherHostsDeny:
		s.deny(w, r, "other hosts are not served by this proxy")
	case !s.portAllowed(port):
		s.deny(w, r, "CONNECT to port "+port+" is not allowed (proxy.connect_ports)")
	case isSelf(r, target):
		s.deny(w, r, "CONNECT to the proxy itself is not allowed")
	default:
		s.tunnel(w, r, target)
	}
}

func (s *Server) deny(w http.ResponseWriter, r *http.Request, why string) {
	s.Stats.Denied.Add(1)
	s.log.Debug("denied", "method", r.Method, "host", r.URL.Host, "why", why)
	http.Error(w, "solveonce: "+why, http.StatusForbidden)
}

func (s *Server) portAllowed(port string) bool {
	p, err := strconv.Atoi(port)
	return err == nil && slices.Contains(s.ports, p)
}

// redactURL drops the password from a proxy URL for logging.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// goproxyLogger sends goproxy's messages to slog at Debug. goproxy logs
// hosts and paths, never query strings, so API keys stay out of the log.
type goproxyLogger struct{ log *slog.Logger }

func (l goproxyLogger) Printf(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "goproxy")
	}
}

// CertificatesGenerated returns how many MITM leaf certificates this
// server has signed (0 when https interception is off).
func (s *Server) CertificatesGenerated() int64 {
	if s.mitm == nil {
		return 0
	}
	return s.mitm.generated.Load()
}
