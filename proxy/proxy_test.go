package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/captchaaitest"
)

func newTLSClientConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

// modes are the three ways a client reaches CaptchaAI through solveonce.
var modes = []struct {
	name string
	base func(s *stack) string
	http func(tb testing.TB, s *stack) *http.Client
}{
	{"base-URL", func(s *stack) string { return s.URL }, func(tb testing.TB, _ *stack) *http.Client { return directClient(tb) }},
	{"proxy plain http", func(*stack) string { return "http://ocr.captchaai.com" }, func(tb testing.TB, s *stack) *http.Client { return s.client(tb, nil, nil) }},
	{"proxy https MITM", func(*stack) string { return "https://ocr.captchaai.com" }, func(tb testing.TB, s *stack) *http.Client { return s.client(tb, nil, nil) }},
}

// dedupRun is what one client population saw, and what reached CaptchaAI.
type dedupRun struct {
	submits, polls int64
	outcomes       []string // of the sequential requests
	bodies         []string
}

// runDedupScenario: 20 concurrent identical submissions, the same again
// (text and JSON), then polls until solved and after.
func runDedupScenario(t *testing.T, s *stack, c *http.Client, base string) dedupRun {
	t.Helper()
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := postForm(t, c, base+"/in.php", imageForm(keyA, 1, i%2 == 1))
			if r.Status != http.StatusOK {
				t.Errorf("in.php: %d %q", r.Status, r.Body)
				return
			}
			ids[i] = taskID(t, r)
		})
	}
	wg.Wait()
	for i := range ids {
		if ids[i] != ids[0] {
			t.Fatalf("concurrent identical submissions got different tasks: %q", ids)
		}
	}
	var run dedupRun
	note := func(r result) {
		run.outcomes = append(run.outcomes, r.Outcome)
		run.bodies = append(run.bodies, strings.ReplaceAll(r.Body, ids[0], "<id>"))
	}
	note(postForm(t, c, base+"/in.php", imageForm(keyA, 1, false)))
	note(postForm(t, c, base+"/in.php", imageForm(keyA, 1, true)))
	for range 4 {
		note(get(t, c, base+"/res.php?"+url.Values{"key": {keyA}, "action": {"get"}, "id": {ids[0]}}.Encode()))
	}
	note(get(t, c, base+"/res.php?"+url.Values{"key": {keyA}, "action": {"get"}, "id": {ids[0]}, "json": {"1"}}.Encode()))
	run.submits, run.polls = s.Fake.Submits(), s.Fake.Polls()
	return run
}

// Plain-http and MITM'd https CaptchaAI calls through the proxy are
// deduplicated exactly as base-URL mode: same answers, same outcomes,
// same counts at the fake upstream.
func TestForwardProxyDedupMatchesBaseURL(t *testing.T) {
	var runs []dedupRun
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			s := newStack(t, stackOptions{fake: []captchaaitest.Option{captchaaitest.Latency(100 * time.Millisecond), captchaaitest.SolveAfterPolls(1)}})
			runs = append(runs, runDedupScenario(t, s, m.http(t, s), m.base(s)))
		})
	}
	if len(runs) != len(modes) {
		t.Fatal("a mode failed")
	}
	want := runs[0]
	if want.submits != 1 || want.polls < 1 || want.polls > 2 {
		t.Fatalf("base-URL mode: %d submits, %d polls upstream; want 1, 1..2 (%q)", want.submits, want.polls, want.outcomes)
	}
	ans := "OK|" + captchaaitest.ImageAnswer(image(1))
	wantBodies := []string{"OK|<id>", `{"status":1,"request":"<id>"}`, ans, ans, ans, ans, `{"status":1,"request":"` + ans[3:] + `"}`}
	if !slices.Equal(want.bodies, wantBodies) {
		t.Fatalf("base-URL bodies %q, want %q", want.bodies, wantBodies)
	}
	for i, r := range runs[1:] {
		if r.submits != want.submits || r.polls != want.polls {
			t.Errorf("%s: %d submits, %d polls upstream; base-URL mode made %d, %d", modes[i+1].name, r.submits, r.polls, want.submits, want.polls)
		}
		if !slices.Equal(r.outcomes, want.outcomes) {
			t.Errorf("%s: outcomes %q; base-URL mode %q", modes[i+1].name, r.outcomes, want.outcomes)
		}
		if !slices.Equal(r.bodies, want.bodies) {
			t.Errorf("%s: bodies %q; base-URL mode %q", modes[i+1].name, r.bodies, want.bodies)
		}
	}
}

// The three modes share one dedup engine: a task submitted in one is
// replayed in the others.
func TestModesShareOneEngine(t *testing.T) {
	s := newStack(t, stackOptions{})
	pc := s.client(t, nil, nil)
	id := taskID(t, postForm(t, directClient(t), s.URL+"/in.php", imageForm(keyA, 2, false)))
	for _, base := range []string{"http://ocr.captchaai.com", "https://OCR.CaptchaAI.com:443", "http://ocr.captchaai.com:8080"} {
		r := postForm(t, pc, base+"/in.php", imageForm(keyA, 2, false))
		if taskID(t, r) != id || r.Outcome != "replayed" {
			t.Errorf("%s: %q %s; want task %s replayed", base, r.Body, r.Outcome, id)
		}
	}
	if got := s.Fake.Submits(); got != 1 {
		t.Errorf("%d submits upstream, want 1", got)
	}
	if got := s.Srv.Stats.Intercepted.Load(); got != 3 {
		t.Errorf("Stats.Intercepted = %d, want 3", got)
	}
}

// A client whose HTTP_PROXY is solveonce, calling solveonce's own base
// URL, is answered rather than looped.
func TestProxiedRequestToSelfIsBaseURL(t *testing.T) {
	s := newStack(t, stackOptions{})
	r := get(t, s.client(t, nil, nil), s.URL+"/healthz")
	if r.Status != http.StatusOK || r.Body != "ok\n" {
		t.Fatalf("healthz through the proxy: %d %q", r.Status, r.Body)
	}
	r = postForm(t, s.client(t, nil, nil), s.URL+"/in.php", imageForm(keyA, 3, false))
	if !strings.HasPrefix(r.Body, "OK|") {
		t.Fatalf("in.php to self through the proxy: %q", r.Body)
	}
}

// API keys travel in query strings; no log line, at any level, holds one.
func TestLogsNeverHoldAPIKeys(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := newStack(t, stackOptions{log: log})
	pc := s.client(t, nil, nil)
	for _, base := range []string{"http://ocr.captchaai.com", "https://ocr.captchaai.com"} {
		id := taskID(t, postForm(t, pc, base+"/in.php?key="+keyB, imageForm(keyB, 4, false)))
		get(t, pc, base+"/res.php?"+url.Values{"key": {keyB}, "action": {"get"}, "id": {id}}.Encode())
	}
	// A forward that fails (nothing listens on port 1) must not log its URL.
	r := get(t, pc, "http://127.0.0.1:1/x?key="+keyB)
	if r.Status != http.StatusBadGateway {
		t.Errorf("unreachable origin: %d, want 502", r.Status)
	}
	_ = s.Layer.Wait(t.Context())
	out := buf.String()
	if !strings.Contains(out, "intercepted") {
		t.Fatalf("debug log has no request lines; the test checks nothing:\n%s", out)
	}
	if strings.Contains(out, keyB) {
		t.Fatalf("an API key reached the log:\n%s", out)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"defaults", Config{}, ""},
		{"deny", Config{OtherHosts: "deny"}, ""},
		{"bad other_hosts", Config{OtherHosts: "drop"}, "proxy.other_hosts"},
		{"bad port", Config{ConnectPorts: []int{443, 70000}}, "proxy.connect_ports"},
		{"host with port", Config{InterceptHosts: []string{"ocr.captchaai.com:443"}}, "proxy.intercept_hosts"},
		{"host as URL", Config{InterceptHosts: []string{"https://ocr.captchaai.com"}}, "proxy.intercept_hosts"},
		{"ip host", Config{InterceptHosts: []string{"::1", "127.0.0.2"}}, ""},
		{"parent socks5", Config{ParentProxy: "socks5://u:p@127.0.0.1:1080"}, ""},
		{"parent env", Config{ParentProxy: "env"}, ""},
		{"parent ftp", Config{ParentProxy: "ftp://127.0.0.1"}, "proxy.parent_proxy"},
		{"parent upstream alone", Config{ParentProxyUpstream: true}, "proxy.parent_proxy_upstream"},
		{"user without password", Config{AuthUser: "u"}, "proxy.auth_user"},
		{"password without user", Config{AuthPassword: "p"}, "proxy.auth_user"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v does not name %s", err, c.want)
			}
		})
	}
}

// A parent proxy that is solveonce itself would loop.
func TestParentLoopRefused(t *testing.T) {
	_, err := New(Config{Listen: "127.0.0.1:8080", ParentProxy: "http://localhost:8080", DataDir: t.TempDir()}, nil, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "loop") {
		t.Fatalf("New: %v; want a loop error", err)
	}
}

func TestHostMatching(t *testing.T) {
	h := newHostSet([]string{"ocr.captchaai.com", "::1"})
	for in, want := range map[string]bool{
		"ocr.captchaai.com":       true,
		"OCR.CaptchaAI.com:443":   true,
		"ocr.captchaai.com.:8443": true,
		"[::1]:443":               true,
		"captchaai.com":           false,
		"xocr.captchaai.com":      false,
		"ocr.captchaai.com.evil":  false,
		"127.0.0.1:443":           false,
	} {
		if got := h.match(in); got != want {
			t.Errorf("match(%q) = %v, want %v", in, got, want)
		}
	}
	for in, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:1": true, "[::1]:8080": true,
		":8080": false, "0.0.0.0:8080": false, "10.0.0.1:8080": false,
	} {
		if got := isLoopbackAddr(in); got != want {
			t.Errorf("isLoopbackAddr(%q) = %v, want %v", in, got, want)
		}
	}
}

// Clients that send an https:// URL in absolute form over plain http
// instead of CONNECT (older axios) are answered too, without TLS.
func TestAbsoluteFormHTTPSURL(t *testing.T) {
	s := newStack(t, stackOptions{})
	c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "https://ocr.captchaai.com/res.php?action=getbalance&key="+keyA, nil)
	if err := req.WriteProxy(c); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "10.50" {
		t.Fatalf("absolute-form https getbalance: %d %q", resp.StatusCode, b)
	}
}
