package proxy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elazarl/goproxy"
)

// The CA is created when absent: ECDSA P-256, key mode 0600 in a 0700
// directory; loaded, not recreated, the next time.
func TestCACreatedWithPrivateKeyMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "solveonce")
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	var logs syncBuffer
	ca, err := LoadOrCreateCA(certFile, keyFile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{keyFile: 0o600, dir: 0o700 | os.ModeDir, certFile: 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
	if !bytes.Contains([]byte(logs.String()), []byte(keyFile)) {
		t.Errorf("creation is not logged with the key's path: %q", logs.String())
	}
	pub, ok := ca.Cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("CA key is %T, want ECDSA P-256", ca.Cert.PublicKey)
	}
	if !ca.Cert.IsCA || ca.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Error("not a CA certificate")
	}
	again, err := LoadOrCreateCA(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cert.Equal(ca.Cert) {
		t.Error("second start made a new CA instead of loading the existing one")
	}
	// Through New, from the data directory.
	s := newStack(t, stackOptions{})
	_, key, _ := s.Srv.cfg.CAFiles()
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("New's CA key %s: %v %v", key, fi.Mode(), err)
	}
}

// Half a CA is an error, never overwritten.
func TestCAHalfPresentRefused(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	writeFile(t, keyFile, []byte("precious"))
	if _, err := LoadOrCreateCA(certFile, keyFile, nil); err == nil {
		t.Fatal("a key without a certificate was accepted")
	}
	if b, _ := os.ReadFile(keyFile); string(b) != "precious" {
		t.Fatal("the existing key file was overwritten")
	}
	if _, err := os.Stat(certFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a certificate was written next to a foreign key")
	}
}

// goproxy's bundled CA, whose private key is public, is refused, by
// LoadCA and by New (so solveonce does not start).
func TestBundledGoproxyCARefused(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	writeFile(t, certFile, goproxy.CA_CERT)
	writeFile(t, keyFile, goproxy.CA_KEY)
	if _, err := LoadOrCreateCA(certFile, keyFile, nil); !errors.Is(err, ErrBundledCA) {
		t.Fatalf("LoadOrCreateCA: %v, want ErrBundledCA", err)
	}
	_, err := New(Config{CACert: certFile, CAKey: keyFile}, nil, slog.New(slog.DiscardHandler))
	if !errors.Is(err, ErrBundledCA) {
		t.Fatalf("New: %v, want ErrBundledCA", err)
	}
}

// Concurrent first handshakes for a host share one leaf generation; the
// leaf is ECDSA P-256, for that host, and chains to the CA.
func TestLeafGeneratedOncePerHost(t *testing.T) {
	ca, _, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	m := newMITM(ca, newHostSet([]string{"ocr.captchaai.com"}))
	const n = 64
	certs := make([]*tls.Certificate, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			c, err := m.leaf("ocr.captchaai.com")
			if err != nil {
				t.Error(err)
			}
			certs[i] = c
		})
	}
	close(start)
	wg.Wait()
	if got := m.generated.Load(); got != 1 {
		t.Fatalf("%d leaf generations for one host, want 1", got)
	}
	for _, c := range certs {
		if c != certs[0] {
			t.Fatal("callers got different certificates")
		}
	}
	leaf := certs[0].Leaf
	if _, ok := certs[0].PrivateKey.(*ecdsa.PrivateKey); !ok {
		t.Errorf("leaf key is %T, want ECDSA", certs[0].PrivateKey)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "ocr.captchaai.com", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	// Another host is another generation; the first stays cached.
	if _, err := m.leaf("api.captchaai.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.leaf("ocr.captchaai.com"); err != nil {
		t.Fatal(err)
	}
	if got := m.generated.Load(); got != 2 {
		t.Errorf("%d generations for two hosts, want 2", got)
	}
	// A leaf close to expiry is replaced.
	m.now = func() time.Time { return time.Now().Add(leafValidity) }
	if c, _ := m.leaf("ocr.captchaai.com"); c == certs[0] {
		t.Error("an expiring leaf was served from the cache")
	}
}

// The MITM'd handshake presents a certificate only for intercepted names:
// an SNI naming another host gets none.
func TestMITMRefusesForeignSNI(t *testing.T) {
	s := newStack(t, stackOptions{})
	_, conn, br := rawConnect(t, s.Addr, "ocr.captchaai.com:443", http.Header{}, nil)
	if br.Buffered() > 0 {
		t.Fatal("unexpected bytes after the CONNECT answer")
	}
	tc := tls.Client(conn, &tls.Config{ServerName: "bank.example", RootCAs: s.CAPool, MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake for bank.example inside a tunnel to ocr.captchaai.com succeeded")
	}
	if got := s.Srv.mitm.generated.Load(); got != 0 {
		t.Errorf("%d certificates minted, want 0", got)
	}
}

// A MITM'd tunnel stays open for many requests (keep-alive on the client
// side of the tunnel), and one leaf serves them all.
func TestMITMKeepAlive(t *testing.T) {
	s := newStack(t, stackOptions{})
	var conns atomic.Int32
	tr := s.client(t, nil, nil).Transport.(*http.Transport)
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conns.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	c := &http.Client{Transport: tr, Timeout: testTimeout}
	for i := range 5 {
		r := postForm(t, c, "https://ocr.captchaai.com/in.php", imageForm(keyA, 10+i, false))
		if r.Outcome != "miss" {
			t.Fatalf("request %d: %s %q", i, r.Outcome, r.Body)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for 5 sequential requests, want 1", n)
	}
	if got := s.Srv.mitm.generated.Load(); got != 1 {
		t.Errorf("%d leaves minted, want 1", got)
	}
}

func ExampleCA_Sign() {
	ca, _, err := NewCA()
	if err != nil {
		panic(err)
	}
	leaf, err := ca.Sign("ocr.captchaai.com", time.Now())
	if err != nil {
		panic(err)
	}
	fmt.Println(leaf.Leaf.DNSNames, leaf.Leaf.Issuer.Organization)
	// Output: [ocr.captchaai.com] [solveonce]
}

// tlsClient completes a TLS handshake as ocr.captchaai.com over conn.
func tlsClient(t *testing.T, conn net.Conn, roots *x509.CertPool) *tls.Conn {
	t.Helper()
	tc := tls.Client(conn, &tls.Config{ServerName: "ocr.captchaai.com", RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}
