package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/pingback"
)

// pbStack is solveonce with pingback delivery, in front of a fake
// CaptchaAI, on loopback; stop shuts it down gracefully (a restart is a
// stop and a new pbStack on the same data directory).
type pbStack struct {
	*stack
	PB   *pingback.Service
	stop func()
}

// pbConfig is the configuration of the pingback end-to-end tests: short
// durations, data in dir.
func pbConfig(fakeURL, dir string) config.File {
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Upstream.BaseURL = fakeURL
	cfg.Proxy.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "off"
	cfg.Cache.PendingTTL = 100 * time.Millisecond
	p := &cfg.Pingback
	p.FirstPollImage = 50 * time.Millisecond
	p.FirstPollToken = 50 * time.Millisecond
	p.PollInterval = 100 * time.Millisecond
	p.PollDeadline = 20 * time.Second
	p.Timeout = 300 * time.Millisecond
	p.BackoffBase = 50 * time.Millisecond
	p.BackoffCap = 200 * time.Millisecond
	p.MaxAge = 3 * time.Second
	return cfg
}

// startPB builds solveonce exactly as `go run .` does (build, serve) and
// serves it; stop shuts it down gracefully.
func startPB(t *testing.T, fake *captchaaitest.Server, cfg config.File) *pbStack {
	t.Helper()
	require.NoError(t, cfg.Validate())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := build(cfg, nil, log)
	require.NoError(t, err)
	require.NotNil(t, a.pings, "pingback wired by build()")
	base, stop := serveApp(t, a)
	tr := &http.Transport{MaxIdleConnsPerHost: 256, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	st := &stack{URL: base, Fake: fake, App: a, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	return &pbStack{stack: st, PB: a.pings, stop: stop}
}

// hooks is a set of loopback pingback receivers, one per path.
type hooks struct {
	*httptest.Server
	mu       sync.Mutex
	got      map[string][]url.Values // path → id/code of each successful call
	tries    map[string]int          // path → calls
	failures map[string]int          // path → calls still to answer 503
	down     map[string]bool         // path → answer 500
	in, peak atomic.Int64            // concurrent calls to /slow/…, which hang until the caller gives up
}

func newHooks(t *testing.T) *hooks {
	h := &hooks{got: map[string][]url.Values{}, tries: map[string]int{}, failures: map[string]int{}, down: map[string]bool{}}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.Close)
	return h
}

func (h *hooks) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/slow/") {
		n := h.in.Add(1)
		defer h.in.Add(-1)
		for {
			p := h.peak.Load()
			if n <= p || h.peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(10 * time.Second):
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tries[r.URL.Path]++
	if h.failures[r.URL.Path] > 0 {
		h.failures[r.URL.Path]--
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if h.down[r.URL.Path] {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	h.got[r.URL.Path] = append(h.got[r.URL.Path], r.URL.Query())
	_, _ = io.WriteString(w, "OK")
}

func (h *hooks) url(path string) string { return h.URL + path }

func (h *hooks) calls(path string) []url.Values {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]url.Values(nil), h.got[path]...)
}

func (h *hooks) attempts(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tries[path]
}

// submitWithPingback submits image n with a pingback URL and returns the
// task ID and X-Solveonce outcome.
func (s *pbStack) submitWithPingback(t *testing.T, n int, pingbackURL string) (string, string) {
	t.Helper()
	v := imageForm(keyA, n, false)
	v.Set("pingback", pingbackURL)
	r := s.postForm(t, "/in.php", v, nil)
	return taskID(t, r), r.Outcome
}

// dlq runs `solveonce dlq args… -dlq path` and returns its output.
func dlq(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, append(append([]string{"dlq"}, args...), "-dlq", path), nil, &out, &errb)
	return out.String() + errb.String(), err
}

// Three merged submissions with three different pingback URLs all get the
// answer once: the first from CaptchaAI, the others from solveonce, which
// polls by itself (nobody polls here) and never delivers twice.
func TestPingbackFanOut(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	s := startPB(t, fake, pbConfig(fake.URL, t.TempDir()))
	h := newHooks(t)

	id, out := s.submitWithPingback(t, 1, h.url("/one"))
	require.Equal(t, "miss", out)
	id2, out := s.submitWithPingback(t, 1, h.url("/two?client=2"))
	require.Equal(t, id, id2)
	require.Equal(t, "replayed", out)
	id3, _ := s.submitWithPingback(t, 1, h.url("/three"))
	require.Equal(t, id, id3)
	require.EqualValues(t, 1, fake.Submits())

	answer := captchaaitest.ImageAnswer(image(1))
	require.Eventually(t, func() bool {
		return len(h.calls("/one")) == 1 && len(h.calls("/two")) == 1 && len(h.calls("/three")) == 1
	}, 10*time.Second, 10*time.Millisecond)
	for _, p := range []string{"/one", "/two", "/three"} {
		q := h.calls(p)[0]
		require.Equal(t, id, q.Get("id"), p)
		require.Equal(t, answer, q.Get("code"), p)
	}
	require.Equal(t, "2", h.calls("/two")[0].Get("client"), "the URL's own query is kept")
	require.LessOrEqual(t, fake.PollsFor(id), int64(4), "solveonce polls politely, once per task")

	// A repeated subscriber gets nothing more; a client poll is served from
	// the cache solveonce's own poll filled.
	_, out = s.submitWithPingback(t, 1, h.url("/two?client=2"))
	require.Equal(t, "replayed", out)
	polls := fake.PollsFor(id)
	r := s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
	require.Equal(t, "OK|"+answer, r.Body)
	require.Equal(t, polls, fake.PollsFor(id))
	time.Sleep(500 * time.Millisecond)
	for _, p := range []string{"/one", "/two", "/three"} {
		require.Len(t, h.calls(p), 1, p)
	}
	require.EqualValues(t, 1, s.PB.Stats.Duplicates.Load())
	require.EqualValues(t, 2, s.PB.Stats.Delivered.Load())
	require.EqualValues(t, 1, fake.Pingbacks(), "CaptchaAI called only the first submission's pingback")
}

// A receiver down for its first three attempts gets the answer on a later
// retry.
func TestPingbackRetriesUntilTheReceiverIsUp(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	s := startPB(t, fake, pbConfig(fake.URL, t.TempDir()))
	h := newHooks(t)
	h.failures["/flaky"] = 3

	id, _ := s.submitWithPingback(t, 2, h.url("/leader"))
	s.submitWithPingback(t, 2, h.url("/flaky"))
	require.Eventually(t, func() bool { return len(h.calls("/flaky")) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 4, h.attempts("/flaky"))
	require.Equal(t, id, h.calls("/flaky")[0].Get("id"))
	require.EqualValues(t, 3, s.PB.Stats.Retries.Load())
	require.Zero(t, s.PB.DeadLetters())
}

// A receiver down past max_age lands in the dead-letter queue, which
// survives a restart of solveonce; `dlq replay` delivers it once the
// receiver is up, and only once.
func TestPingbackDeadLetterSurvivesRestartAndReplays(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	dir := t.TempDir()
	cfg := pbConfig(fake.URL, dir)
	cfg.Pingback.MaxAge = 500 * time.Millisecond
	path, err := cfg.Pingback.Path(dir)
	require.NoError(t, err)
	h := newHooks(t)
	h.down["/down"] = true

	s := startPB(t, fake, cfg)
	id, _ := s.submitWithPingback(t, 3, h.url("/leader"))
	s.submitWithPingback(t, 3, h.url("/down?x=1"))
	require.Eventually(t, func() bool { return s.PB.DeadLetters() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Greater(t, h.attempts("/down"), 1, "retried before giving up")
	s.stop()

	// Stopped: the command reads the file itself. No API key is in it.
	out, err := dlq(t, path, "list")
	require.NoError(t, err, out)
	require.Contains(t, out, id)
	require.Contains(t, out, "/down?x=1")
	require.Contains(t, out, "HTTP 500")
	out, err = dlq(t, path, "list", "-json")
	require.NoError(t, err)
	require.NotContains(t, out, keyA)
	require.Contains(t, out, captchaaitest.ImageAnswer(image(3)))

	// Restarted: the entry is still there, and the running solveonce
	// answers the command through its control socket.
	s = startPB(t, fake, cfg)
	require.EqualValues(t, 1, s.PB.DeadLetters())
	out, err = dlq(t, path, "replay")
	require.Error(t, err, "the receiver is still down")
	require.Contains(t, out, "failed")
	require.EqualValues(t, 1, s.PB.DeadLetters())

	h.mu.Lock()
	h.down["/down"] = false
	h.mu.Unlock()
	out, err = dlq(t, path, "replay")
	require.NoError(t, err, out)
	require.Contains(t, out, "delivered 1, failed 0, skipped 0")
	require.Len(t, h.calls("/down"), 1)
	q := h.calls("/down")[0]
	require.Equal(t, id, q.Get("id"))
	require.Equal(t, captchaaitest.ImageAnswer(image(3)), q.Get("code"))
	require.Equal(t, "1", q.Get("x"))
	require.Zero(t, s.PB.DeadLetters())

	out, err = dlq(t, path, "list")
	require.NoError(t, err)
	require.Contains(t, out, "no dead letters")
	out, err = dlq(t, path, "replay")
	require.NoError(t, err, out)
	require.Contains(t, out, "delivered 0")

	s.stop()
	out, err = dlq(t, path, "list")
	require.NoError(t, err)
	require.Contains(t, out, "no dead letters")
}

// A link-local (cloud metadata) pingback target is refused, and so is
// anything that is not an http(s) URL.
func TestPingbackLinkLocalTargetRefused(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	s := startPB(t, fake, pbConfig(fake.URL, t.TempDir()))
	h := newHooks(t)
	s.submitWithPingback(t, 4, h.url("/leader"))
	_, out := s.submitWithPingback(t, 4, "http://169.254.169.254/latest/meta-data/")
	require.Equal(t, "replayed", out, "the submission itself is served")
	s.submitWithPingback(t, 4, "http://[fe80::1]/cb")
	s.submitWithPingback(t, 4, "file:///etc/passwd")
	require.EqualValues(t, 3, s.PB.Stats.Refused.Load())
	require.Zero(t, s.PB.Held())
	require.Zero(t, s.PB.DeadLetters())
}

// 1,000 subscribers on a receiver that hangs do not hold up another
// receiver or the proxy: deliveries run on a bounded pool with a per-host
// cap, every subscriber is settled within max_age plus a timeout, and the
// goroutine count stays bounded.
func TestPingbackThousandSubscribersSlowReceiver(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	cfg := pbConfig(fake.URL, t.TempDir())
	cfg.Pingback.MaxAge = 2 * time.Second
	s := startPB(t, fake, cfg)
	h := newHooks(t)
	base := runtime.NumGoroutine()

	id, _ := s.submitWithPingback(t, 5, h.url("/leader"))
	start := time.Now()
	const n = 1000
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var slowest atomic.Int64
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			t0 := time.Now()
			got, _ := s.submitWithPingback(t, 5, h.url(fmt.Sprintf("/slow/%d", i)))
			require.Equal(t, id, got)
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
		})
	}
	wg.Wait()
	fast := newHooks(t) // another receiver (host:port)
	s.submitWithPingback(t, 5, fast.url("/fast"))
	require.Less(t, time.Duration(slowest.Load()), 2*time.Second, "submissions are not held up by pingbacks")

	// The fast receiver is served although 1,000 slow deliveries are due.
	require.Eventually(t, func() bool { return len(fast.calls("/fast")) == 1 }, 5*time.Second, 10*time.Millisecond)

	// The proxy answers other clients meanwhile.
	t0 := time.Now()
	other := taskID(t, s.postForm(t, "/in.php", imageForm(keyB, 6, false), nil))
	require.True(t, strings.HasPrefix(s.pollUntilDone(t, keyB, other).Body, "OK|"))
	require.Less(t, time.Since(t0), 3*time.Second)
	require.Less(t, runtime.NumGoroutine()-base, 400, "goroutines stay bounded")

	// Everybody is settled in bounded time: delivered or dead-lettered.
	require.Eventually(t, func() bool { return s.PB.Held() == 0 }, cfg.Pingback.MaxAge+cfg.Pingback.Timeout+10*time.Second, 20*time.Millisecond)
	require.EqualValues(t, n, s.PB.DeadLetters())
	// The receiver sees a timed-out call end a moment after solveonce has
	// moved on, so its count may overlap a little; the pingback package's
	// tests check the cap exactly.
	require.LessOrEqual(t, h.peak.Load(), int64(2*cfg.Pingback.HostWorkers), "one host holds at most host_workers workers")
	t.Logf("1000 slow subscribers settled in %v", time.Since(start))
}
