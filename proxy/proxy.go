// Package proxy is solveonce's HTTP front: base-URL mode (clients call
// /in.php and /res.php on solveonce), forward-proxy mode (HTTP_PROXY /
// HTTPS_PROXY, with the CaptchaAI host intercepted and everything else
// passed through untouched), and the health endpoint.
package proxy

import (
	"log/slog"
	"net/http"
)

// Config configures the proxy front.
type Config struct {
	// Listen is the proxy's address; "" → 127.0.0.1:8080 (loopback unless
	// configured otherwise).
	Listen string `toml:"listen"`
	// MaxBody bounds a request body solveonce reads; 0 → 2 MiB. Larger
	// in.php bodies get ERROR_TOO_BIG_CAPTCHA_FILESIZE.
	MaxBody int64 `toml:"max_body"`
	// CACert and CAKey are the MITM certificate authority's PEM files,
	// created (key mode 0600) when absent; "" → ca.pem / ca-key.pem in the
	// data directory.
	CACert string `toml:"ca_cert"`
	CAKey  string `toml:"ca_key"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 2 << 20
	}
	return c
}

// Server is the proxy front's http.Handler.
type Server struct {
	cfg     Config
	captcha *Captcha
	log     *slog.Logger
}

// New returns a Server answering CaptchaAI requests with captcha.
func New(cfg Config, captcha *Captcha, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg.WithDefaults(), captcha: captcha, log: log}, nil
}

// ServeHTTP routes one request: origin-form requests are base-URL mode.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect || r.URL.IsAbs() {
		http.Error(w, "forward-proxy mode is not enabled", http.StatusNotImplemented)
		return
	}
	switch {
	case r.URL.Path == "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	default:
		// Everything else is CaptchaAI's business: understood requests are
		// deduplicated, the rest forwarded unchanged.
		s.captcha.ServeHTTP(w, r)
	}
}
