package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/solveonce/solveonce/metrics"
)

type fixture struct {
	srv   *Server
	url   string
	store atomic.Pointer[error] // what the store check returns
}

func (f *fixture) setStore(err error) { f.store.Store(&err) }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{}
	f.setStore(nil)
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "solveonce_test_total", Help: "A test counter."})
	c.Add(3)
	reg.MustRegister(c)
	f.srv = New(Config{
		Gatherer: reg,
		Summary: func() metrics.Summary {
			return metrics.Summary{
				Submissions: 10, Deduplicated: 6, SavingsPercent: 60, MoneySaved: 1.25, Currency: "EUR",
				Methods: []metrics.MethodSummary{{Method: "<image>", Submissions: 10, Deduplicated: 6, SavingsPercent: 60}},
			}
		},
		Checks: []Check{
			{Name: "store", Func: func(context.Context) error { return *f.store.Load() }},
		},
		CheckTimeout: 200 * time.Millisecond,
	})
	hs := httptest.NewServer(f.srv)
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f
}

func get(t *testing.T, url string) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestAdminHealthz(t *testing.T) {
	f := newFixture(t)
	code, body, _ := get(t, f.url+"/healthz")
	if code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q", code, body)
	}
}

func TestAdminReadyz(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name     string
		serving  bool
		store    error
		code     int
		contains []string
	}{
		{"starting", false, nil, 503, []string{"not ready\n", "serving: failing"}},
		{"serving", true, nil, 200, []string{"ready\n", "serving: ok\n", "store: ok\n"}},
		{"store down", true, errors.New("dial tcp 127.0.0.1:6379: connect:\n refused"), 503,
			[]string{"not ready\n", "store: failing: dial tcp 127.0.0.1:6379: connect: refused\n"}},
		{"store degraded", true, Degraded("failed over to memory"), 200, []string{"ready\n", "store: degraded: failed over to memory\n"}},
		{"draining", false, nil, 503, []string{"not ready\n", "serving: failing"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.srv.SetServing(c.serving)
			f.setStore(c.store)
			code, body, _ := get(t, f.url+"/readyz")
			if code != c.code {
				t.Errorf("code %d, want %d; body:\n%s", code, c.code, body)
			}
			for _, s := range c.contains {
				if !strings.Contains(body, s) {
					t.Errorf("body lacks %q:\n%s", s, body)
				}
			}
		})
	}

	f.srv.SetServing(true)
	f.setStore(Degraded("x"))
	code, body, hdr := get(t, f.url+"/readyz?format=json")
	var rd Readiness
	if err := json.Unmarshal([]byte(body), &rd); err != nil || code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("json readyz: %d %v %q", code, err, body)
	}
	if !rd.Ready || len(rd.Checks) != 2 || rd.Checks[1].Status != StatusDegraded {
		t.Fatalf("json readyz: %+v", rd)
	}
}

func TestAdminReadyzBoundsSlowChecks(t *testing.T) {
	srv := New(Config{
		Checks:       []Check{{Name: "slow", Func: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}},
		CheckTimeout: 50 * time.Millisecond,
	})
	srv.SetServing(true)
	start := time.Now()
	rd := srv.Readiness(context.Background())
	if rd.Ready || rd.Checks[1].Status != StatusFailing || time.Since(start) > 2*time.Second {
		t.Fatalf("slow check: %+v after %v", rd, time.Since(start))
	}
}

func TestAdminMetrics(t *testing.T) {
	f := newFixture(t)
	code, body, hdr := get(t, f.url+"/metrics")
	if code != 200 || !strings.Contains(body, "solveonce_test_total 3") {
		t.Fatalf("/metrics = %d:\n%s", code, body)
	}
	if !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Errorf("Content-Type %q", hdr.Get("Content-Type"))
	}

	bare := httptest.NewServer(New(Config{}))
	defer bare.Close()
	for _, p := range []string{"/metrics", "/stats"} {
		if code, _, _ := get(t, bare.URL+p); code != http.StatusNotFound {
			t.Errorf("%s without a source = %d, want 404", p, code)
		}
	}
}

func TestAdminStats(t *testing.T) {
	f := newFixture(t)
	code, body, _ := get(t, f.url+"/stats")
	var s metrics.Summary
	if err := json.Unmarshal([]byte(body), &s); err != nil || code != 200 {
		t.Fatalf("/stats = %d %v:\n%s", code, err, body)
	}
	if s.Submissions != 10 || s.Deduplicated != 6 || s.SavingsPercent != 60 || s.Currency != "EUR" || len(s.Methods) != 1 {
		t.Fatalf("/stats: %+v", s)
	}
}

func TestAdminStatusPage(t *testing.T) {
	f := newFixture(t)
	f.srv.SetServing(true)
	code, body, hdr := get(t, f.url+"/")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("/ = %d %q", code, hdr.Get("Content-Type"))
	}
	for _, s := range []string{">ready<", "<b>6</b>", "of 10 submissions deduplicated (60.0%)", "1.25 EUR", "&lt;image&gt;", "store</td><td class=\"ok\">ok"} {
		if !strings.Contains(body, s) {
			t.Errorf("status page lacks %q", s)
		}
	}
	if strings.Contains(body, "<image>") {
		t.Error("status page does not escape values")
	}
	if code, _, _ := get(t, f.url+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope = %d, want 404", code)
	}
}

func TestAdminRejectsOtherMethods(t *testing.T) {
	f := newFixture(t)
	resp, err := http.Post(f.url+"/healthz", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /healthz = %d, want 405", resp.StatusCode)
	}
}
