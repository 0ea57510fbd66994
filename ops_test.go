package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/metrics"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
)

// opsStack is a stack with its admin listener on and its log captured.
type opsStack struct {
	*stack
	Admin string // admin base URL
	Log   *syncBuffer
}

// startOpsStack starts solveonce with the admin listener on a free
// loopback port, logging at debug level (JSON) into a buffer.
func startOpsStack(t *testing.T, mutate func(*config.File), fakeOpts ...captchaaitest.Option) *opsStack {
	t.Helper()
	fake := captchaaitest.NewServer(t, fakeOpts...)
	adminAddr := freeAddr(t)
	cfg := config.Default()
	cfg.Upstream.BaseURL = fake.URL
	cfg.Proxy.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = adminAddr
	cfg.DataDir = t.TempDir()
	cfg.Cache.PendingTTL = 100 * time.Millisecond
	cfg.Log = config.Log{Level: "debug", Format: "json"}
	if mutate != nil {
		mutate(&cfg)
	}
	require.NoError(t, cfg.Validate())
	logs := &syncBuffer{}
	a, err := build(cfg, nil, newLogger(cfg.Log, logs))
	require.NoError(t, err)
	base, _ := serveApp(t, a)
	tr := &http.Transport{MaxIdleConnsPerHost: 64, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	s := &opsStack{
		stack: &stack{URL: base, Fake: fake, App: a, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}},
		Admin: "http://" + adminAddr,
		Log:   logs,
	}
	waitReady(t, s.Admin, 10*time.Second)
	return s
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// syncBuffer is a bytes.Buffer safe for one writer and many readers.
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

// adminGet fetches an admin path.
func adminGet(t testing.TB, base, path string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// waitReady polls /readyz until it answers 200.
func waitReady(t testing.TB, base string, within time.Duration) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}, Timeout: time.Second}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if resp, err := c.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s/readyz not ready within %v", base, within)
}

// scrape is a parsed /metrics: the series of each metric name.
type scrape map[string]*family

type family struct {
	series []series
}

// series is one labelled value (a histogram's sample count).
type series struct {
	labels map[string]string
	value  float64
}

// scrapeMetrics fetches and parses /metrics; it also returns the text.
func scrapeMetrics(t testing.TB, base string) (scrape, string) {
	t.Helper()
	code, body := adminGet(t, base, "/metrics")
	require.Equal(t, http.StatusOK, code)
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	out := scrape{}
	for name, mf := range mfs {
		f := &family{}
		for _, m := range mf.GetMetric() {
			s := series{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				s.value = m.GetGauge().GetValue()
			case m.Untyped != nil:
				s.value = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				s.value = float64(m.GetHistogram().GetSampleCount())
			}
			f.series = append(f.series, s)
		}
		out[name] = f
	}
	return out, body
}

// sum adds the values of every series of name whose labels include all of
// match ("key=value"); -1 when there is no such metric.
func (s scrape) sum(name string, match ...string) float64 {
	f, ok := s[name]
	if !ok {
		return -1
	}
	var total float64
next:
	for _, se := range f.series {
		for _, kv := range match {
			k, v, _ := strings.Cut(kv, "=")
			if se.labels[k] != v {
				continue next
			}
		}
		total += se.value
	}
	return total
}

// After a scripted run the metrics hold exactly: every client submission
// is either an upstream submission or a saved one, and the upstream
// numbers agree with what the fake CaptchaAI saw.
func TestOpsMetricsHoldExactlyAfterScriptedRun(t *testing.T) {
	s := startOpsStack(t, nil)
	const distinct, concurrent, later = 5, 4, 2
	var wg sync.WaitGroup
	ids := make([]string, distinct)
	for c := range distinct {
		var mu sync.Mutex
		for range concurrent {
			wg.Go(func() {
				id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 500+c, false), nil))
				mu.Lock()
				defer mu.Unlock()
				if ids[c] != "" && ids[c] != id {
					t.Errorf("captcha %d: two task IDs %s and %s", c, ids[c], id)
				}
				ids[c] = id
			})
		}
	}
	wg.Wait()
	for c := range distinct {
		for range later {
			require.Equal(t, ids[c], taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 500+c, false), nil)))
		}
	}
	polls := 0
	for _, id := range ids {
		for range 3 {
			for {
				polls++
				r := s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
				if r.Body != "CAPCHA_NOT_READY" {
					require.True(t, strings.HasPrefix(r.Body, "OK|"), r.Body)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}

	m, body := scrapeMetrics(t, s.Admin)
	clientSubmits := float64(distinct * (concurrent + later))
	upstreamSubmits := m.sum("solveonce_upstream_requests_total", "endpoint=in.php")
	saved := m.sum("solveonce_submits_saved_total")
	require.Equal(t, clientSubmits, m.sum("solveonce_client_requests_received_total", "endpoint=in.php"), body)
	require.Equal(t, float64(distinct), upstreamSubmits, "upstream in.php requests")
	require.EqualValues(t, s.Fake.SubmitRequests(), upstreamSubmits, "metrics and the fake disagree")
	require.Equal(t, clientSubmits-float64(distinct), saved)
	require.Equal(t, clientSubmits, upstreamSubmits+saved, "client submissions = upstream submissions + saved")
	require.Equal(t, clientSubmits, m.sum("solveonce_client_requests_total", "endpoint=in.php"), "outcomes add up")
	require.Equal(t, float64(distinct), m.sum("solveonce_client_requests_total", "endpoint=in.php", "outcome=miss"))
	require.Equal(t, clientSubmits, m.sum("solveonce_method_submits_total", "family=image", "outcome=received"))
	require.InDelta(t, saved/1000, m.sum("solveonce_money_saved_total", "currency=USD"), 1e-12, "default price 1 per 1,000")

	// Polls: every upstream poll is counted once, and every client poll is
	// answered from memory, by a shared poll, or by an upstream poll.
	require.Equal(t, float64(polls), m.sum("solveonce_client_requests_received_total", "endpoint=res.php"))
	require.EqualValues(t, s.Fake.Polls(), m.sum("solveonce_upstream_requests_total", "endpoint=res.php"))
	require.EqualValues(t, s.Fake.Polls(), m.sum("solveonce_client_requests_total", "endpoint=res.php", "outcome=miss"))
	require.Equal(t, float64(polls), m.sum("solveonce_client_requests_total", "endpoint=res.php"))
	require.Equal(t, float64(polls)-float64(s.Fake.Polls()), m.sum("solveonce_polls_absorbed_total"))

	require.Equal(t, 1.0, m.sum("solveonce_breaker_state", "state=closed"))
	require.Positive(t, m.sum("solveonce_answer_cache_entries"))
	require.Equal(t, float64(s.Fake.SubmitRequests()+s.Fake.Polls()), m.sum("solveonce_upstream_attempt_duration_seconds", "class=ok")+m.sum("solveonce_upstream_attempt_duration_seconds", "class=not_ready"))

	// /stats says the same.
	code, js := adminGet(t, s.Admin, "/stats")
	require.Equal(t, http.StatusOK, code)
	var sum metrics.Summary
	require.NoError(t, json.Unmarshal([]byte(js), &sum))
	require.EqualValues(t, clientSubmits, sum.Submissions)
	require.EqualValues(t, saved, sum.Deduplicated)
	require.EqualValues(t, distinct, sum.SubmitsUpstream)
	require.Equal(t, 83.33, sum.SavingsPercent)
	require.EqualValues(t, float64(polls)-float64(s.Fake.Polls()), sum.PollsAbsorbed)
	require.Len(t, sum.Methods, 1)
	require.Equal(t, "image", sum.Methods[0].Method)
	require.Equal(t, "closed", sum.Upstream.Breaker)

	// The status page shows it at a glance.
	code, page := adminGet(t, s.Admin, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, fmt.Sprintf("<b>%d</b><span>of %d submissions deduplicated (83.3%%)", int(saved), int(clientSubmits)))
	require.Contains(t, page, "<td>image</td>")
}

// A session with a bad key, upstream errors and every endpoint leaves no
// API key in /metrics or in the log (at debug level), which names accounts
// by their hash instead.
func TestOpsNoAPIKeyInMetricsOrLogs(t *testing.T) {
	const badKey = "zzbadkeyzzbadkeyzzbadkeyzzbadkey"
	s := startOpsStack(t, func(c *config.File) { c.Breaker.ConsecutiveFailures = 100 },
		captchaaitest.ValidKeys(keyA))

	id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 1, false), nil))
	s.pollUntilDone(t, keyA, id)
	s.postForm(t, "/in.php", imageForm(keyA, 1, true), nil) // replayed
	for range 2 {
		r := s.postForm(t, "/in.php", imageForm(badKey, 2, false), nil)
		require.True(t, strings.HasPrefix(r.Body, "ERROR_"), r.Body)
		s.get(t, "/res.php", url.Values{"key": {badKey}, "action": {"get"}, "id": {id}})
	}
	s.Fake.FailNext("res.php", 2, captchaaitest.FaultHTML502)
	id2 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 3, false), nil))
	s.pollUntilDone(t, keyA, id2)
	s.Fake.FailNext("in.php", 1, captchaaitest.FaultServerError)
	s.postForm(t, "/in.php", imageForm(keyA, 4, false), nil)
	s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"getbalance"}})
	s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"reportbad"}, "id": {id}})
	s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"reportbad"}, "id": {id}})
	_, m := scrapeMetrics(t, s.Admin)
	_, stats := adminGet(t, s.Admin, "/stats")
	_, page := adminGet(t, s.Admin, "/")
	_, ready := adminGet(t, s.Admin, "/readyz")

	logs := s.Log.String()
	require.Contains(t, logs, "upstream rejected API key", "the bad key was logged (by account)")
	require.Contains(t, logs, "upstream attempt failed", "the upstream errors were logged")
	for name, text := range map[string]string{"log": logs, "/metrics": m, "/stats": stats, "/": page, "/readyz": ready} {
		for _, key := range []string{keyA, badKey} {
			for i := 0; i+12 <= len(key); i++ {
				if strings.Contains(text, key[i:i+12]) {
					t.Errorf("%s contains %q, part of an API key", name, key[i:i+12])
					break
				}
			}
		}
	}
}

// /readyz fails while the store (Redis) is unreachable and recovers with
// it; with admin.ready_requires_store = false the outage is reported as
// degraded and the replica stays ready.
func TestOpsReadyzFollowsTheStore(t *testing.T) {
	for _, required := range []bool{true, false} {
		t.Run(fmt.Sprintf("ready_requires_store=%v", required), func(t *testing.T) {
			rs := redistest.Start(t)
			s := startOpsStack(t, func(c *config.File) {
				c.Store.Kind = "redis"
				c.Store.RedisURL = "redis://" + rs.Addr() + "/0"
				c.Admin.ReadyRequiresStore = required
			})
			code, body := adminGet(t, s.Admin, "/readyz")
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "store: ok")

			rs.Stop()
			if required {
				body = waitReadyz(t, s.Admin, http.StatusServiceUnavailable, "store: failing", 10*time.Second)
				require.Contains(t, body, "not ready\nserving: ok\nstore: failing: redis store ")
			} else {
				body = waitReadyz(t, s.Admin, http.StatusOK, "store: degraded", 10*time.Second)
				require.Contains(t, body, "ready\nserving: ok\nstore: degraded: redis store ")
			}

			rs.Restart()
			body = waitReadyz(t, s.Admin, http.StatusOK, "store: ok", 15*time.Second)
			require.True(t, strings.HasPrefix(body, "ready\n"), body)
		})
	}
}

// waitReadyz polls /readyz until it answers code with a body containing
// substr, and returns that body.
func waitReadyz(t *testing.T, base string, code int, substr string, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		c, body := adminGet(t, base, "/readyz")
		if c == code && strings.Contains(body, substr) {
			return body
		}
		last = fmt.Sprintf("%d %s", c, body)
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("/readyz never answered %d with %q; last:\n%s", code, substr, last)
	return ""
}

// healthcheck exits non-zero when nothing answers, zero when the admin
// listener is up, and refuses when the admin listener is off.
func TestHealthcheckSubcommand(t *testing.T) {
	s := startOpsStack(t, nil)
	env := []string{"HOME=" + t.TempDir()}
	var out, errb bytes.Buffer
	ctx := context.Background()
	require.NoError(t, run(ctx, []string{"healthcheck", "-admin", strings.TrimPrefix(s.Admin, "http://")}, env, &out, &errb))
	require.Equal(t, "ok\n", out.String())

	err := run(ctx, []string{"healthcheck", "-admin", freeAddr(t)}, env, &out, &errb)
	require.Error(t, err)
	require.Contains(t, err.Error(), "healthcheck")

	err = run(ctx, []string{"healthcheck"}, append(env, "SOLVEONCE_ADMIN_LISTEN=off"), &out, &errb)
	require.ErrorContains(t, err, "off")

	// A wildcard listen address is asked on loopback.
	addr, err := dialAddr("0.0.0.0:9090")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9090", addr)
	addr, err = dialAddr("[::]:9090")
	require.NoError(t, err)
	require.Equal(t, "[::1]:9090", addr)
}

// buildBinary builds solveonce into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "solveonce")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// childEnv is the environment of a solveonce child process: the test's,
// without anything that could configure solveonce or send it through a
// proxy, plus extra.
func childEnv(t *testing.T, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, config.EnvPrefix), strings.EqualFold(k, "HTTP_PROXY"), strings.EqualFold(k, "HTTPS_PROXY"),
			strings.EqualFold(k, "ALL_PROXY"), strings.EqualFold(k, "NO_PROXY"), k == "HOME", k == "XDG_CONFIG_HOME":
			continue
		}
		env = append(env, kv)
	}
	home := t.TempDir()
	return append(env, append([]string{"HOME=" + home, "XDG_CONFIG_HOME=" + home}, extra...)...)
}

// SIGTERM while submissions are in flight: the process stops accepting,
// reports not ready, lets every client get its answer, and exits 0. Then
// `solveonce healthcheck` fails, since nothing answers any more.
func TestShutdownOnSIGTERMAnswersInFlightClients(t *testing.T) {
	bin := buildBinary(t)
	fake := captchaaitest.NewServer(t, captchaaitest.Latency(1500*time.Millisecond))
	proxyAddr, adminAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-listen", proxyAddr, "-admin", adminAddr, "-upstream", fake.URL)
	cmd.Env = childEnv(t, "SOLVEONCE_LOG_FORMAT=json", "SOLVEONCE_SHUTDOWN_TIMEOUT=20s", "SOLVEONCE_DATA_DIR="+t.TempDir())
	var stderr syncBuffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan struct{}) // closed once cmd.Wait returned waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
			t.Logf("solveonce log:\n%s", stderr.String())
		}
	})
	adminURL := "http://" + adminAddr
	waitReady(t, adminURL, 20*time.Second)

	healthcheck := func() error {
		hctx, hcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer hcancel()
		hc := exec.CommandContext(hctx, bin, "healthcheck", "-admin", adminAddr)
		hc.Env = childEnv(t)
		return hc.Run()
	}
	require.NoError(t, healthcheck(), "healthcheck of a running server")

	// 10 distinct captchas, each submitted twice at once.
	const distinct = 10
	type answer struct {
		n    int
		body string
		err  error
	}
	answers := make(chan answer, 2*distinct)
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 2 * distinct {
		go func() {
			n := i % distinct
			resp, err := client.PostForm("http://"+proxyAddr+"/in.php", imageForm(keyA, 9000+n, false))
			if err != nil {
				answers <- answer{n: n, err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{n: n, body: string(b), err: err}
		}()
	}
	// Wait until every distinct submission is at the (slow) upstream.
	deadline := time.Now().Add(10 * time.Second)
	for fake.SubmitRequests() < distinct {
		require.True(t, time.Now().Before(deadline), "submissions never reached upstream: %d", fake.SubmitRequests())
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))

	// While draining: not ready, and no new connections.
	deadline = time.Now().Add(time.Second)
	for {
		code, _ := adminGet(t, adminURL, "/readyz")
		if code == http.StatusServiceUnavailable {
			break
		}
		require.True(t, time.Now().Before(deadline), "/readyz still %d after SIGTERM", code)
		time.Sleep(5 * time.Millisecond)
	}
	if c, err := net.DialTimeout("tcp", proxyAddr, time.Second); err == nil {
		c.Close()
		t.Error("the proxy still accepts connections after SIGTERM")
	}

	ids := map[int]string{}
	for range 2 * distinct {
		select {
		case a := <-answers:
			require.NoError(t, a.err, "client %d lost its answer", a.n)
			require.True(t, strings.HasPrefix(a.body, "OK|"), "client %d got %q", a.n, a.body)
			if id, ok := ids[a.n]; ok {
				require.Equal(t, id, a.body, "duplicates of captcha %d got different tasks", a.n)
			}
			ids[a.n] = a.body
		case <-time.After(30 * time.Second):
			t.Fatal("clients still waiting 30s after SIGTERM")
		}
	}
	select {
	case <-exited:
		require.NoError(t, waitErr, "solveonce must exit 0 after a graceful shutdown; log:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("solveonce did not exit after SIGTERM")
	}
	require.EqualValues(t, distinct, fake.Submits(), "one task per distinct captcha")
	log := stderr.String()
	for _, msg := range []string{`"msg":"solveonce listening"`, `"msg":"admin listening"`, `"msg":"shutting down"`, `"msg":"stopped"`} {
		require.Contains(t, log, msg)
	}

	err := healthcheck()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee) && ee.ExitCode() != 0, "healthcheck of a stopped server must exit non-zero, got %v", err)
}
