package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// echoTLSOrigin is a non-CaptchaAI https site on loopback that answers
// with the request body and its hash.
func echoTLSOrigin(t *testing.T) (*httptest.Server, int) {
	t.Helper()
	origin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(b)
		w.Header().Set("X-Body-Sha256", hex.EncodeToString(sum[:]))
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(b)
	}))
	t.Cleanup(origin.Close)
	_, port, _ := net.SplitHostPort(origin.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return origin, p
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// An https request to another host is tunnelled untouched: the client sees
// the origin's own certificate, not one of ours, and the bytes arrive
// unchanged both ways.
func TestOtherHostTunnelledUntouched(t *testing.T) {
	origin, port := echoTLSOrigin(t)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.ConnectPorts = []int{443, port} }})
	roots := x509.NewCertPool()
	roots.AddCert(origin.Certificate()) // the origin's certificate only: not our CA
	c := s.client(t, nil, roots)

	body := randomBytes(t, 256<<10)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, origin.URL+"/echo", bytes.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.TLS == nil || !resp.TLS.PeerCertificates[0].Equal(origin.Certificate()) {
		t.Fatal("the client did not see the origin's own certificate")
	}
	sum := sha256.Sum256(body)
	if resp.Header.Get("X-Body-Sha256") != hex.EncodeToString(sum[:]) {
		t.Error("the origin received different bytes")
	}
	if !bytes.Equal(got, body) {
		t.Error("the client received different bytes")
	}
	if got := s.Srv.mitm.generated.Load(); got != 0 {
		t.Errorf("%d certificates minted for a tunnelled host, want 0", got)
	}
	if got := s.Srv.Stats.Tunnels.Load(); got != 1 {
		t.Errorf("Stats.Tunnels = %d, want 1", got)
	}
}

// echoTCP is a raw TCP server that echoes everything and half-closes at
// the client's end of stream.
func echoTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(testTimeout))
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// The splice is byte for byte, keeps bytes sent in the same packet as the
// CONNECT, and carries a half-close through.
func TestTunnelSplicesBytesAndHalfClose(t *testing.T) {
	addr := echoTCP(t)
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.ConnectPorts = []int{p} }})

	early := []byte("early bytes in the CONNECT packet\x00\xff")
	resp, conn, br := rawConnect(t, s.Addr, addr, http.Header{}, early)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	payload := randomBytes(t, 1<<20)
	go func() {
		_, _ = conn.Write(payload)
		_ = conn.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(br) // ends only if the echo's half-close came back
	if err != nil {
		t.Fatal(err)
	}
	if want := append(early, payload...); !bytes.Equal(got, want) {
		t.Fatalf("echo differs: got %d bytes, want %d", len(got), len(want))
	}
}

// other_hosts = "deny" refuses other hosts with 403, CONNECT and plain
// alike, while CaptchaAI keeps working.
func TestOtherHostsDeny(t *testing.T) {
	origin, port := echoTLSOrigin(t)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("denied request reached the origin") }))
	t.Cleanup(plain.Close)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.OtherHosts = OtherHostsDeny; c.ConnectPorts = []int{port} }})

	resp, _, _ := rawConnect(t, s.Addr, origin.Listener.Addr().String(), http.Header{}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("CONNECT to another host: %s, want 403", resp.Status)
	}
	r := get(t, s.client(t, nil, nil), plain.URL+"/x")
	if r.Status != http.StatusForbidden {
		t.Errorf("plain http to another host: %d, want 403", r.Status)
	}
	r = postForm(t, s.client(t, nil, nil), "https://ocr.captchaai.com/in.php", imageForm(keyA, 1, false))
	if !strings.HasPrefix(r.Body, "OK|") {
		t.Errorf("CaptchaAI under deny: %q", r.Body)
	}
	if got := s.Srv.Stats.Denied.Load(); got != 2 {
		t.Errorf("Stats.Denied = %d, want 2", got)
	}
}

// CONNECT reaches only connect_ports.
func TestConnectPortsEnforced(t *testing.T) {
	addr := echoTCP(t) // a random port, not in the default 443, 80
	s := newStack(t, stackOptions{})
	resp, _, _ := rawConnect(t, s.Addr, addr, http.Header{}, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("CONNECT to port outside connect_ports: %s, want 403", resp.Status)
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "connect_ports") {
		t.Errorf("refusal does not say why: %q", b)
	}
	// Intercepted hosts are answered locally on any port.
	resp, _, _ = rawConnect(t, s.Addr, "ocr.captchaai.com:8443", http.Header{}, nil)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("CONNECT to the intercepted host on 8443: %s", resp.Status)
	}
}

// Plain http to another host is forwarded with hop-by-hop fields removed,
// both ways, and end-to-end fields and bodies untouched.
func TestPlainHTTPHopByHop(t *testing.T) {
	seenc := make(chan http.Header, 1)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenc <- r.Header.Clone()
		w.Header().Set("Connection", "X-Hop-Resp")
		w.Header().Set("X-Hop-Resp", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-End-Resp", "1")
		w.Header().Set("Content-Encoding", "gzip") // not ours to decode
		_, _ = w.Write([]byte("not really gzip"))
	}))
	t.Cleanup(origin.Close)
	s := newStack(t, stackOptions{})
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, origin.URL+"/p?q=1", nil)
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "1")
	req.Header.Set("Keep-Alive", "300")
	req.Header.Set("X-End", "1")
	req.Header.Set("Accept-Encoding", "br")
	r := do(t, s.client(t, nil, nil), req)
	seen := <-seenc
	for _, k := range []string{"X-Hop", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization"} {
		if seen.Get(k) != "" {
			t.Errorf("hop-by-hop %s reached the origin", k)
		}
	}
	if seen.Get("X-End") != "1" || seen.Get("Accept-Encoding") != "br" {
		t.Errorf("end-to-end fields lost: %v", seen)
	}
	if r.Header.Get("X-Hop-Resp") != "" || r.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop response fields reached the client: %v", r.Header)
	}
	if r.Header.Get("X-End-Resp") != "1" || r.Header.Get("Content-Encoding") != "gzip" || r.Body != "not really gzip" {
		t.Errorf("response changed: %v %q", r.Header, r.Body)
	}
	if got := s.Srv.Stats.Forwarded.Load(); got != 1 {
		t.Errorf("Stats.Forwarded = %d, want 1", got)
	}
}

// Without CA files, forward-proxy mode still tunnels and answers plain
// http; https interception answers 503.
func TestNoCAInterceptionOff(t *testing.T) {
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.DataDir = "" }})
	resp, _, _ := rawConnect(t, s.Addr, "ocr.captchaai.com:443", http.Header{}, nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("CONNECT without CA: %s, want 503", resp.Status)
	}
	if r := postForm(t, s.client(t, nil, nil), "http://ocr.captchaai.com/in.php", imageForm(keyA, 1, false)); !strings.HasPrefix(r.Body, "OK|") {
		t.Errorf("plain http without CA: %q", r.Body)
	}
}

// Shutdown ends tunnels at once and MITM'd connections between requests;
// the clients see their connections close.
func TestShutdownClosesTakenOverConnections(t *testing.T) {
	addr := echoTCP(t)
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.ConnectPorts = []int{p} }})

	_, tunnel, tbr := rawConnect(t, s.Addr, addr, http.Header{}, nil)
	_, mitmConn, _ := rawConnect(t, s.Addr, "ocr.captchaai.com:443", http.Header{}, nil)
	tc := tlsClient(t, mitmConn, s.CAPool)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.Srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := tbr.ReadByte(); err == nil {
		t.Error("tunnel still open after Shutdown")
	}
	if _, err := tc.Read(make([]byte, 1)); err == nil {
		t.Error("MITM'd connection still open after Shutdown")
	}
	_ = tunnel
	if err := s.Srv.Close(); err != nil {
		t.Errorf("Close after Shutdown: %v", err)
	}
}

// A CONNECT to the intercepted host on port 80 carrying plain HTTP is
// answered too (goproxy sniffs TLS).
func TestPlainHTTPInsideInterceptedTunnel(t *testing.T) {
	s := newStack(t, stackOptions{})
	_, conn, br := rawConnect(t, s.Addr, "ocr.captchaai.com:80", http.Header{}, nil)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://ocr.captchaai.com/res.php?action=getbalance&key="+keyA, nil)
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "10.50" || resp.Header.Get(Header) == "" {
		t.Fatalf("getbalance inside a plain tunnel: %d %q", resp.StatusCode, b)
	}
}
