package proxy

import (
	"bufio"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/upstream"
)

// testParent is a loopback parent proxy (HTTP or SOCKS5) that counts what
// it carries and requires credentials.
type testParent struct {
	URL string

	mu       sync.Mutex // guards connects, forwards
	connects []string   // tunnel targets
	forwards []string   // absolute-form request hosts

	wg sync.WaitGroup
}

func (p *testParent) seen() (connects, forwards []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.connects...), append([]string(nil), p.forwards...)
}

func (p *testParent) record(list *[]string, v string) {
	p.mu.Lock()
	*list = append(*list, v)
	p.mu.Unlock()
}

// relay copies both ways until both ends are done, then closes both.
func (p *testParent) relay(a, b net.Conn) {
	p.wg.Go(func() {
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = io.Copy(b, a); _ = b.(*net.TCPConn).CloseWrite() })
		_, _ = io.Copy(a, b)
		if tc, ok := a.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		wg.Wait()
		_ = a.Close()
		_ = b.Close()
	})
}

// startHTTPParent is an HTTP parent proxy requiring Basic pu:pp.
func startHTTPParent(t *testing.T) *testParent {
	t.Helper()
	p := &testParent{}
	tr := &http.Transport{Proxy: nil}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, pw, ok := parseProxyAuth(r); !ok || user != "pu" || pw != "pp" {
			w.Header().Set("Proxy-Authenticate", "Basic")
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		if r.Method == http.MethodConnect {
			p.record(&p.connects, r.Host)
			up, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			c, rw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				_ = up.Close()
				return
			}
			if rw.Reader.Buffered() > 0 {
				t.Error("test parent: early bytes not handled")
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
			p.relay(c, up)
			return
		}
		p.record(&p.forwards, r.URL.Host)
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.Header.Del("Proxy-Authorization")
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections(); p.wg.Wait() })
	p.URL = "http://pu:pp@" + srv.Listener.Addr().String()
	return p
}

func parseProxyAuth(r *http.Request) (user, pw string, ok bool) {
	req := &http.Request{Header: http.Header{"Authorization": r.Header.Values("Proxy-Authorization")}}
	return req.BasicAuth()
}

// startSOCKS5Parent is a SOCKS5 parent requiring username/password su:sp.
func startSOCKS5Parent(t *testing.T) *testParent {
	t.Helper()
	p := &testParent{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serveSOCKS5(t, c) })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	p.URL = "socks5://su:sp@" + ln.Addr().String()
	return p
}

func (p *testParent) serveSOCKS5(t *testing.T, c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	br := bufio.NewReader(c)
	fail := func(msg string) { t.Errorf("test SOCKS5 parent: %s", msg); _ = c.Close() }
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil || hdr[0] != 5 {
		fail("bad greeting")
		return
	}
	methods := make([]byte, hdr[1])
	_, _ = io.ReadFull(br, methods)
	if !strings.Contains(string(methods), "\x02") {
		_, _ = c.Write([]byte{5, 0xff})
		_ = c.Close()
		return
	}
	_, _ = c.Write([]byte{5, 2})
	readStr := func() string {
		n, _ := br.ReadByte()
		b := make([]byte, n)
		_, _ = io.ReadFull(br, b)
		return string(b)
	}
	if v, _ := br.ReadByte(); v != 1 {
		fail("bad auth version")
		return
	}
	if user, pw := readStr(), readStr(); user != "su" || pw != "sp" {
		_, _ = c.Write([]byte{1, 1})
		_ = c.Close()
		return
	}
	_, _ = c.Write([]byte{1, 0})
	req := make([]byte, 4)
	if _, err := io.ReadFull(br, req); err != nil || req[1] != 1 {
		fail("bad request")
		return
	}
	var host string
	switch req[3] {
	case 1:
		ip := make([]byte, 4)
		_, _ = io.ReadFull(br, ip)
		host = net.IP(ip).String()
	case 3:
		host = readStr()
	default:
		fail("unexpected address type")
		return
	}
	pb := make([]byte, 2)
	_, _ = io.ReadFull(br, pb)
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(pb))))
	p.record(&p.connects, target)
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		_, _ = c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		_ = c.Close()
		return
	}
	_, _ = c.Write([]byte{5, 0, 0, 1, 127, 0, 0, 1, 0, 0})
	_ = c.SetDeadline(time.Time{})
	p.relay(c, up)
}

// Other-host traffic, CONNECT and plain, goes through the parent proxy;
// CaptchaAI traffic does not unless parent_proxy_upstream says so.
func TestParentProxyCarriesOtherHosts(t *testing.T) {
	for _, kind := range []string{"http", "socks5"} {
		t.Run(kind, func(t *testing.T) {
			parent := startHTTPParent(t)
			if kind == "socks5" {
				parent = startSOCKS5Parent(t)
			}
			origin, port := echoTLSOrigin(t)
			plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "plain origin") }))
			t.Cleanup(plain.Close)
			s := newStack(t, stackOptions{cfg: func(c *Config) { c.ParentProxy = parent.URL; c.ConnectPorts = []int{port} }})

			roots := x509.NewCertPool()
			roots.AddCert(origin.Certificate())
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, origin.URL, strings.NewReader("through the parent"))
			r := do(t, s.client(t, nil, roots), req)
			if r.Body != "through the parent" {
				t.Fatalf("tunnel via parent: %d %q", r.Status, r.Body)
			}
			if r := get(t, s.client(t, nil, nil), plain.URL+"/x"); r.Body != "plain origin" {
				t.Fatalf("plain via parent: %d %q", r.Status, r.Body)
			}
			if r := postForm(t, s.client(t, nil, nil), "https://ocr.captchaai.com/in.php", imageForm(keyA, 1, false)); !strings.HasPrefix(r.Body, "OK|") {
				t.Fatalf("CaptchaAI: %q", r.Body)
			}
			connects, forwards := parent.seen()
			originAddr, plainAddr := origin.Listener.Addr().String(), plain.Listener.Addr().String()
			want := []string{originAddr}
			if kind == "socks5" { // net/http reaches a SOCKS5 parent by tunnelling too
				want = append(want, plainAddr)
			} else if len(forwards) != 1 || forwards[0] != plainAddr {
				t.Errorf("parent forwarded %q, want [%s]", forwards, plainAddr)
			}
			if strings.Join(connects, ",") != strings.Join(want, ",") {
				t.Errorf("parent tunnelled to %q, want %q", connects, want)
			}
			if n := s.Fake.Requests(); n != 1 {
				t.Errorf("fake CaptchaAI saw %d requests, want 1 (direct)", n)
			}
		})
	}
}

// parent_proxy_upstream sends solveonce's own CaptchaAI calls through the
// parent, through the function main gives the upstream transport.
func TestParentProxyUpstream(t *testing.T) {
	parent := startHTTPParent(t)
	cfg := Config{ParentProxy: parent.URL, ParentProxyUpstream: true}
	pf, err := ParentProxyFunc(cfg)
	if err != nil || pf == nil {
		t.Fatalf("ParentProxyFunc: nil=%t, %v", pf == nil, err)
	}
	tr := upstream.NewTransport(0)
	tr.Proxy = pf
	t.Cleanup(tr.CloseIdleConnections)
	s := newStack(t, stackOptions{upstream: tr, cfg: func(c *Config) { c.ParentProxy = cfg.ParentProxy; c.ParentProxyUpstream = true }})
	if r := postForm(t, s.client(t, nil, nil), "https://ocr.captchaai.com/in.php", imageForm(keyA, 1, false)); !strings.HasPrefix(r.Body, "OK|") {
		t.Fatalf("CaptchaAI via parent: %q", r.Body)
	}
	fakeHost := strings.TrimPrefix(s.Fake.URL, "http://")
	if _, forwards := parent.seen(); len(forwards) != 1 || forwards[0] != fakeHost {
		t.Errorf("parent forwarded %q, want [%s]", forwards, fakeHost)
	}
	if off, _ := ParentProxyFunc(Config{ParentProxy: parent.URL}); off != nil {
		t.Error("ParentProxyFunc without parent_proxy_upstream must be nil (direct)")
	}
}

// A parent that refuses the tunnel is a 502 for the client.
func TestParentProxyRefusal(t *testing.T) {
	parent := startHTTPParent(t)
	u, _ := url.Parse(parent.URL)
	u.User = url.UserPassword("pu", "wrong")
	addr := echoTCP(t)
	_, port, _ := net.SplitHostPort(addr)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.ParentProxy = u.String(); p, _ := strconv.Atoi(port); c.ConnectPorts = []int{p} }})
	resp, _, _ := rawConnect(t, s.Addr, addr, http.Header{}, nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("CONNECT through a refusing parent: %s, want 502", resp.Status)
	}
}
