package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

// Test API keys: 32 lower-case hex characters, as CaptchaAI issues them.
const (
	keyA = "0123456789abcdef0123456789abcdef"
	keyB = "fedcba9876543210fedcba9876543210"
)

const testTimeout = 15 * time.Second

// stack is the real solveonce stack (fake CaptchaAI ← upstream client ←
// dedup layer ← Captcha handler ← Server) on a loopback listener.
type stack struct {
	Fake   *captchaaitest.Server
	Srv    *Server
	Addr   string // solveonce's host:port
	URL    string // http://Addr, for base-URL mode
	CAFile string // the MITM CA certificate (PEM)
	CAPool *x509.CertPool
	Layer  *intercept.Layer
}

type stackOptions struct {
	cfg      func(*Config)
	fake     []captchaaitest.Option
	upstream http.RoundTripper // nil: upstream's default transport
	log      *slog.Logger
}

// newStack starts the stack; opts.cfg may change the proxy configuration
// first (its DataDir is a fresh temporary directory).
func newStack(tb testing.TB, opts stackOptions) *stack {
	tb.Helper()
	fake := captchaaitest.NewServer(tb, opts.fake...)
	log := opts.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	up, err := upstream.New(upstream.Config{BaseURL: fake.URL}, breaker.New("test", breaker.Config{}, upstream.IsFailure), opts.upstream)
	if err != nil {
		tb.Fatal(err)
	}
	up.Logger = log
	answers, err := cache.New(cache.Config{PendingTTL: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(answers.Close)
	layer := intercept.New(intercept.Config{}, up, answers, store.NewMemory(store.MemoryConfig{}), intercept.WithLogger(log))

	cfg := Config{DataDir: tb.TempDir()}
	if opts.cfg != nil {
		opts.cfg(&cfg)
	}
	srv, err := New(cfg, NewCaptcha(layer, 0), log)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = hs.Serve(ln)
	}()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			tb.Errorf("http shutdown: %v", err)
		}
		if err := srv.Shutdown(ctx); err != nil {
			tb.Errorf("proxy shutdown: %v", err)
		}
		if err := layer.Wait(ctx); err != nil {
			tb.Errorf("layer: %v", err)
		}
		<-served
	})

	s := &stack{Fake: fake, Srv: srv, Addr: ln.Addr().String(), URL: "http://" + ln.Addr().String(), Layer: layer}
	if srv.mitm != nil {
		s.CAFile, _, _ = srv.cfg.CAFiles()
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			tb.Fatal(err)
		}
		s.CAPool = x509.NewCertPool()
		if !s.CAPool.AppendCertsFromPEM(pem) {
			tb.Fatal("CA file holds no certificate")
		}
	}
	return s
}

// proxyURL is solveonce as a proxy URL, with credentials when given.
func (s *stack) proxyURL(user *url.Userinfo) *url.URL {
	return &url.URL{Scheme: "http", Host: s.Addr, User: user}
}

// client returns an http.Client using solveonce as its proxy and trusting
// roots (nil: the stack's CA), keeping connections alive.
func (s *stack) client(tb testing.TB, user *url.Userinfo, roots *x509.CertPool) *http.Client {
	tb.Helper()
	if roots == nil {
		roots = s.CAPool
	}
	tr := &http.Transport{
		Proxy:               http.ProxyURL(s.proxyURL(user)),
		TLSClientConfig:     newTLSClientConfig(roots),
		MaxIdleConnsPerHost: 64,
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: testTimeout}
}

// directClient talks to solveonce (or anything) without a proxy.
func directClient(tb testing.TB) *http.Client {
	tb.Helper()
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: testTimeout}
}

// result is one answer as a client saw it.
type result struct {
	Status  int
	Body    string
	Header  http.Header
	Outcome string
}

func do(tb testing.TB, c *http.Client, req *http.Request) result {
	tb.Helper()
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s%s: %v", req.Method, req.URL.Host, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return result{Status: resp.StatusCode, Body: string(b), Header: resp.Header, Outcome: resp.Header.Get(Header)}
}

func get(tb testing.TB, c *http.Client, u string) result {
	tb.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return do(tb, c, req)
}

func postForm(tb testing.TB, c *http.Client, u string, form url.Values) result {
	tb.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, u, strings.NewReader(form.Encode()))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return do(tb, c, req)
}

// image returns a deterministic fake picture for n.
func image(n int) []byte {
	return fmt.Appendf(nil, "\x89PNG\r\n\x1a\n fake image number %d %s", n, strings.Repeat("x", 200))
}

func imageForm(key string, n int, json bool) url.Values {
	v := url.Values{"key": {key}, "method": {"base64"}, "body": {base64.StdEncoding.EncodeToString(image(n))}}
	if json {
		v.Set("json", "1")
	}
	return v
}

func taskID(tb testing.TB, r result) string {
	tb.Helper()
	if id, ok := strings.CutPrefix(r.Body, "OK|"); ok {
		return id
	}
	if strings.HasPrefix(r.Body, `{"status":1,"request":"`) {
		return strings.TrimSuffix(strings.TrimPrefix(r.Body, `{"status":1,"request":"`), `"}`)
	}
	tb.Fatalf("not a task answer: %q (%d)", r.Body, r.Status)
	return ""
}

// rawConnect sends a CONNECT for target to the proxy at addr, with extra
// header lines, and returns the proxy's answer and the connection (open
// only when the answer is 200).
func rawConnect(tb testing.TB, addr, target string, header http.Header, early []byte) (*http.Response, net.Conn, *bufio.Reader) {
	tb.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	_ = header.Write(&buf)
	buf.WriteString("\r\n")
	buf.Write(early) // in the same write as the request, as some clients do
	if _, err := c.Write(buf.Bytes()); err != nil {
		tb.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = c.Close()
		return resp, nil, nil
	}
	tb.Cleanup(func() { _ = c.Close() })
	return resp, c, br
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func writeFile(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}
