package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
)

// replica is one solveonce process of a fleet sharing one Redis, built by
// the same code as `go run .`, in front of a fake CaptchaAI.
type replica struct {
	*stack
	name     string
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// startReplica starts solveonce with store.kind = "redis" at redisAddr (a
// host:port) in front of fake; mutate may change the configuration first.
// The replica is stopped gracefully when t ends, unless stopped before.
func startReplica(t *testing.T, name string, fake *captchaaitest.Server, redisAddr string, mutate func(*config.File)) *replica {
	t.Helper()
	cfg := config.Default()
	cfg.DataDir = t.TempDir() // each process has its own (CA, pingback queue)
	cfg.Upstream.BaseURL = fake.URL
	cfg.Proxy.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "off"
	cfg.Cache.PendingTTL = 100 * time.Millisecond
	cfg.Store.Kind = "redis"
	cfg.Store.RedisURL = "redis://" + redisAddr + "/0"
	if mutate != nil {
		mutate(&cfg)
	}
	require.NoError(t, cfg.Validate())
	a, err := build(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{name: name, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.serve(ctx, ln, io.Discard) }()
	tr := &http.Transport{MaxIdleConnsPerHost: 512, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	r.stack = &stack{URL: "http://" + ln.Addr().String(), Fake: fake, App: a, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop shuts the replica down gracefully (in-flight requests and shared
// upstream calls finish) and releases everything it holds.
func (r *replica) stop(t *testing.T) {
	r.stopOnce.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("%s: serve: %v", r.name, err)
			}
		case <-time.After(35 * time.Second):
			t.Errorf("%s did not shut down", r.name)
		}
		r.App.close()
	})
}

// degradations is how often the replica's store switched to its local
// fallback.
func (r *replica) degradations() int64 { return r.App.storeFailover().Stats.Degradations.Load() }

// degraded reports whether the replica is on its local fallback now.
func (r *replica) degraded() bool { return r.App.storeFailover().Degraded() }

// startFleet starts n replicas on one Redis and one fake.
func startFleet(t *testing.T, n int, fake *captchaaitest.Server, redisAddr string, mutate func(*config.File)) []*replica {
	t.Helper()
	fleet := make([]*replica, n)
	for i := range fleet {
		fleet[i] = startReplica(t, fmt.Sprintf("replica %c", 'A'+i), fake, redisAddr, mutate)
	}
	return fleet
}

// tryPost sends an urlencoded POST and returns what the client saw,
// without failing the test (for goroutines and expected failures).
func (s *stack) tryPost(ctx context.Context, path string, params url.Values) (resp, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, strings.NewReader(params.Encode()))
	if err != nil {
		return resp{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return s.tryDo(req)
}

// tryGet sends GET path?params without failing the test.
func (s *stack) tryGet(ctx context.Context, path string, params url.Values) (resp, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path+"?"+params.Encode(), nil)
	if err != nil {
		return resp{}, err
	}
	return s.tryDo(req)
}

func (s *stack) tryDo(req *http.Request) (resp, error) {
	r, err := s.http.Do(req)
	if err != nil {
		return resp{}, err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{Status: r.StatusCode, Body: string(b), Header: r.Header, Outcome: r.Header.Get("X-Solveonce")}, nil
}

// protocolAnswer reports whether r is an answer a CaptchaAI client
// understands: HTTP 200 with a text protocol body.
func protocolAnswer(r resp) bool {
	if r.Status != http.StatusOK {
		return false
	}
	_, err := captchaai.ParseAnswer([]byte(r.Body))
	return err == nil
}

// 300 concurrent identical image submissions spread over two or three
// replicas make one upstream task, and every client gets its ID.
func TestReplicasShareOneTask(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			rs := redistest.Start(t)
			fake := captchaaitest.NewServer(t, captchaaitest.Latency(200*time.Millisecond))
			fleet := startFleet(t, n, fake, rs.Addr(), nil)
			const clients = 300
			var wg sync.WaitGroup
			ids := make([]string, clients)
			outcomes := make([]string, clients)
			start := make(chan struct{})
			for i := range clients {
				wg.Go(func() {
					<-start
					r := fleet[i%n].postForm(t, "/in.php", imageForm(keyA, 1, false), nil)
					require.Equal(t, http.StatusOK, r.Status)
					ids[i], outcomes[i] = taskID(t, r), r.Outcome
				})
			}
			close(start)
			wg.Wait()
			require.EqualValues(t, 1, fake.Submits(), "one upstream task for %d identical submissions on %d replicas", clients, n)
			count := map[string]int{}
			for i := range clients {
				require.Equal(t, ids[0], ids[i])
				count[outcomes[i]]++
			}
			require.Equal(t, 1, count["miss"], "exactly one client led: %v", count)
			t.Logf("outcomes: %v", count)
			for _, r := range fleet {
				require.Zero(t, r.degradations(), "%s degraded against a healthy Redis", r.name)
			}
		})
	}
}

// redisLink is a TCP relay between one replica and Redis, on loopback,
// that can be cut (the replica's connections die and new ones are
// refused, as when its host dies) or stalled (bytes stop flowing, as with
// a hung server or a congested network).
type redisLink struct {
	ln     net.Listener
	target string

	mu      sync.Mutex // guards conns, stalled, cut; cond waits on it
	cond    *sync.Cond
	conns   map[net.Conn]struct{}
	stalled bool
	cut     bool
	wg      sync.WaitGroup
}

// newRedisLink relays 127.0.0.1:<free port> to target until t ends.
func newRedisLink(t *testing.T, target string) *redisLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &redisLink{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.cond = sync.NewCond(&l.mu)
	l.wg.Go(l.accept)
	t.Cleanup(l.Cut)
	return l
}

// Addr is the address the replica dials instead of Redis's.
func (l *redisLink) Addr() string { return l.ln.Addr().String() }

func (l *redisLink) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", l.target, time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !l.track(c, up) {
			return
		}
		l.wg.Go(func() { l.pipe(up, c) })
		l.wg.Go(func() { l.pipe(c, up) })
	}
}

func (l *redisLink) track(conns ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		l.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding bytes back while the link is stalled.
func (l *redisLink) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			for l.stalled && !l.cut {
				l.cond.Wait()
			}
			cut := l.cut
			l.mu.Unlock()
			if cut {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Stall holds every byte back until Flow.
func (l *redisLink) Stall() {
	l.mu.Lock()
	l.stalled = true
	l.mu.Unlock()
}

// Flow lets bytes through again.
func (l *redisLink) Flow() {
	l.mu.Lock()
	l.stalled = false
	l.cond.Broadcast()
	l.mu.Unlock()
}

// Cut closes the listener and every connection, for good, and waits for
// the relay's goroutines.
func (l *redisLink) Cut() {
	l.mu.Lock()
	l.cut = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	_ = l.ln.Close()
	l.wg.Wait()
}

// A replica that dies while its submission is upstream holds the claim
// only as long as it renews the lease: a waiter on another replica keeps
// waiting while it does, and takes over within claim_ttl once it stops.
func TestReplicaDiesHoldingClaim(t *testing.T) {
	const claimTTL = time.Second
	rs := redistest.Start(t)
	fake := captchaaitest.NewServer(t)
	link := newRedisLink(t, rs.Addr())
	short := func(c *config.File) { c.Intercept.ClaimTTL = claimTTL }
	// A reaches Redis through the link; its upstream call hangs (the fake
	// creates the task and never answers) until its 3s upstream timeout.
	a := startReplica(t, "replica A", fake, link.Addr(), func(c *config.File) {
		short(c)
		c.Upstream.Timeout = 3 * time.Second
	})
	b := startReplica(t, "replica B", fake, rs.Addr(), short)
	fake.FailNext("in.php", 1, captchaaitest.FaultTimeout)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _, _ = a.tryPost(ctx, "/in.php", imageForm(keyA, 42, false)) }()
	require.Eventually(t, func() bool { return fake.SubmitRequests() == 1 }, 5*time.Second, 5*time.Millisecond, "A's submission reached upstream (A holds the claim)")

	type result struct {
		r   resp
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		r, err := b.tryPost(t.Context(), "/in.php", imageForm(keyA, 42, false))
		got <- result{r, err, time.Now()}
	}()
	// Longer than the lease: A renews it, so B keeps waiting.
	select {
	case res := <-got:
		t.Fatalf("B did not wait for A's live claim: %+v", res)
	case <-time.After(claimTTL + claimTTL/2):
	}
	require.EqualValues(t, 1, fake.SubmitRequests(), "B must not submit while A's claim is alive")

	// A dies: its Redis connections drop mid-submission, its lease is no
	// longer renewed, and its client gives up.
	link.Cut()
	cancel()
	died := time.Now()
	var res result
	select {
	case res = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("B never took over the dead replica's claim")
	}
	require.NoError(t, res.err)
	require.Equal(t, http.StatusOK, res.r.Status)
	id := taskID(t, res.r)
	took := res.at.Sub(died)
	t.Logf("B took over %v after A died (claim_ttl %v), task %s, outcome %s", took, claimTTL, id, res.r.Outcome)
	require.Less(t, took, claimTTL+time.Second, "takeover within the lease (plus the poll interval)")
	require.Equal(t, "miss", res.r.Outcome, "B led the submission itself")
	require.EqualValues(t, 2, fake.Submits(), "A's hung task and B's")

	// The fleet agrees on B's task from now on.
	c := startReplica(t, "replica C", fake, rs.Addr(), short)
	r := c.postForm(t, "/in.php", imageForm(keyA, 42, false), nil)
	require.Equal(t, id, taskID(t, r))
	require.Equal(t, "replayed", r.Outcome)
}

// An answer solved through one replica is served by the others without an
// upstream poll, and CAPCHA_NOT_READY collapses polls across replicas for
// pending_ttl.
func TestReplicasShareAnswers(t *testing.T) {
	t.Run("solved answer", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1))
		fleet := startFleet(t, 3, fake, rs.Addr(), nil)
		id := taskID(t, fleet[0].postForm(t, "/in.php", imageForm(keyA, 7, false), nil))
		solved := fleet[0].pollUntilDone(t, keyA, id)
		require.Equal(t, "OK|"+captchaaitest.ImageAnswer(image(7)), solved.Body)
		polls := fake.PollsFor(id)
		for _, r := range fleet[1:] {
			for range 3 {
				got := r.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
				require.Equal(t, solved.Body, got.Body, r.name)
				require.Equal(t, "hit", got.Outcome, r.name)
			}
		}
		require.Equal(t, polls, fake.PollsFor(id), "no upstream poll for an answer another replica fetched")
		// Another key still cannot read it.
		r := fleet[1].get(t, "/res.php", url.Values{"key": {keyB}, "action": {"get"}, "id": {id}})
		require.Equal(t, "ERROR_WRONG_CAPTCHA_ID", r.Body)
	})
	t.Run("pending_ttl", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1_000_000))
		fleet := startFleet(t, 3, fake, rs.Addr(), func(c *config.File) { c.Cache.PendingTTL = 3 * time.Second })
		id := taskID(t, fleet[0].postForm(t, "/in.php", imageForm(keyA, 8, false), nil))
		first := fleet[0].get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
		require.Equal(t, "CAPCHA_NOT_READY", first.Body)
		require.EqualValues(t, 1, fake.PollsFor(id))
		for _, r := range fleet[1:] {
			got := r.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
			require.Equal(t, "CAPCHA_NOT_READY", got.Body, r.name)
			require.Equal(t, "hit", got.Outcome, r.name)
		}
		require.EqualValues(t, 1, fake.PollsFor(id), "one upstream poll per pending_ttl for the whole fleet")
	})
}

// The orphans policy (single-use tokens) holds across replicas: its
// delivery, poll and fetch state live in Redis.
func TestReplicasOrphansPolicy(t *testing.T) {
	orphanAfter := func(d time.Duration) func(*config.File) {
		return func(c *config.File) {
			p := c.Intercept.Policies["userrecaptcha"]
			p.OrphanAfter = d
			c.Intercept.Policies["userrecaptcha"] = p
		}
	}
	t.Run("retry through another replica after a disconnect reuses the task", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.Latency(300*time.Millisecond))
		fleet := startFleet(t, 2, fake, rs.Addr(), nil)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := fleet[0].tryPost(ctx, "/in.php", tokenForm(keyA, "https://example.com/login"))
		require.Error(t, err, "the client gave up before the answer")
		require.Eventually(t, func() bool { return fake.Submits() == 1 }, 5*time.Second, 10*time.Millisecond)
		time.Sleep(400 * time.Millisecond) // let the abandoned submission land in the index
		r := fleet[1].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/login"), nil)
		require.Equal(t, "replayed", r.Outcome)
		require.EqualValues(t, 1, fake.Submits(), "the retry must not pay again")
	})
	t.Run("live clients on two replicas get two tasks", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.Latency(100*time.Millisecond))
		fleet := startFleet(t, 2, fake, rs.Addr(), nil)
		var wg sync.WaitGroup
		ids := make([]string, 2)
		for i := range 2 {
			wg.Go(func() {
				ids[i] = taskID(t, fleet[i].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
			})
		}
		wg.Wait()
		require.NotEqual(t, ids[0], ids[1])
		id3 := taskID(t, fleet[1].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
		require.NotContains(t, ids, id3, "the first clients hold their tasks")
		require.EqualValues(t, 3, fake.Submits())
	})
	t.Run("token fetched through one replica is never handed out by another", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1))
		fleet := startFleet(t, 3, fake, rs.Addr(), orphanAfter(200*time.Millisecond))
		id := taskID(t, fleet[0].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/x"), nil))
		require.True(t, strings.HasPrefix(fleet[1].pollUntilDone(t, keyA, id).Body, "OK|TOKEN-"))
		time.Sleep(300 * time.Millisecond) // past orphan_after: silent, but fetched
		id2 := taskID(t, fleet[2].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/x"), nil))
		require.NotEqual(t, id, id2)
	})
	t.Run("a poll through one replica keeps a task alive on another", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1_000_000))
		fleet := startFleet(t, 2, fake, rs.Addr(), orphanAfter(600*time.Millisecond))
		id := taskID(t, fleet[0].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/z"), nil))
		time.Sleep(400 * time.Millisecond)
		// The client polls through B: a sign of life A must see.
		r := fleet[1].get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
		require.Equal(t, "CAPCHA_NOT_READY", r.Body)
		time.Sleep(400 * time.Millisecond) // 800ms since delivery, 400ms since the poll
		id2 := taskID(t, fleet[0].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/z"), nil))
		require.NotEqual(t, id, id2, "a task being polled is not an orphan")
	})
	t.Run("silent task delivered by one replica is an orphan for another", func(t *testing.T) {
		rs := redistest.Start(t)
		fake := captchaaitest.NewServer(t)
		fleet := startFleet(t, 2, fake, rs.Addr(), orphanAfter(200*time.Millisecond))
		id := taskID(t, fleet[0].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/y"), nil))
		time.Sleep(300 * time.Millisecond) // the client crashed: no poll
		r := fleet[1].postForm(t, "/in.php", tokenForm(keyA, "https://example.com/y"), nil)
		require.Equal(t, id, taskID(t, r))
		require.Equal(t, "replayed", r.Outcome)
		require.EqualValues(t, 1, fake.Submits())
	})
}

// Redis stopped mid-run: no client sees an error, each replica keeps
// deduplicating on its own and counts the switch, and sharing resumes
// when Redis is back, including the tasks made during the outage.
func TestRedisOutage(t *testing.T) {
	rs := redistest.Start(t)
	fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1), captchaaitest.Latency(20*time.Millisecond))
	fleet := startFleet(t, 2, fake, rs.Addr(), nil)
	a, b := fleet[0], fleet[1]

	// Clients submit and poll throughout; every answer must be protocol.
	var (
		answers, failures atomic.Int64
		mu                sync.Mutex
		firstFailure      string
	)
	fail := func(format string, args ...any) {
		if failures.Add(1) == 1 {
			mu.Lock()
			firstFailure = fmt.Sprintf(format, args...)
			mu.Unlock()
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := fleet[(w+i)%2]
				sub, err := r.tryPost(t.Context(), "/in.php", imageForm(keyA, 10_000+w*1000+i%5, false))
				if err != nil || !protocolAnswer(sub) {
					fail("%s submit: %v %d %q", r.name, err, sub.Status, sub.Body)
					continue
				}
				answers.Add(1)
				if !strings.HasPrefix(sub.Body, "OK|") {
					continue
				}
				poll, err := fleet[(w+i+1)%2].tryGet(t.Context(), "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {sub.Body[3:]}})
				if err != nil || !protocolAnswer(poll) {
					fail("poll: %v %d %q", err, poll.Status, poll.Body)
					continue
				}
				answers.Add(1)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)

	rs.Stop()
	stopped := time.Now()
	require.Eventually(t, func() bool { return a.degraded() && b.degraded() }, 5*time.Second, 5*time.Millisecond, "both replicas switch to local dedup")
	t.Logf("both replicas degraded %v after Redis stopped", time.Since(stopped))
	time.Sleep(time.Second) // traffic during the outage
	close(stop)
	wg.Wait()
	mu.Lock()
	require.Zero(t, failures.Load(), "client errors during the outage; first: %s", firstFailure)
	mu.Unlock()
	t.Logf("%d protocol answers, 0 client errors, across the outage", answers.Load())

	// Per-replica dedup continues: 50 identical concurrent submissions on
	// one replica make one task, and a later one is replayed from the
	// local index.
	burst := func(r *replica, n int) (ids map[string]bool) {
		ids = map[string]bool{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				id := taskID(t, r.postForm(t, "/in.php", imageForm(keyA, 99, false), nil))
				mu.Lock()
				ids[id] = true
				mu.Unlock()
			})
		}
		wg.Wait()
		return ids
	}
	before := fake.Submits()
	idsA := burst(a, 50)
	require.Len(t, idsA, 1)
	require.EqualValues(t, before+1, fake.Submits(), "50 identical submissions on one degraded replica: one task")
	r := a.postForm(t, "/in.php", imageForm(keyA, 99, false), nil)
	require.Equal(t, "replayed", r.Outcome)
	idsB := burst(b, 50)
	require.Len(t, idsB, 1)
	require.EqualValues(t, before+2, fake.Submits(), "the other replica dedups alone too (cross-replica dedup is what the outage costs)")
	for _, r := range fleet {
		require.Positive(t, r.degradations(), "%s counted the switch", r.name)
		require.Positive(t, r.App.storeFailover().Stats.Fallbacks.Load())
		t.Logf("%s: %d degradations, %d primary errors, %d fallbacks", r.name, r.degradations(), r.App.storeFailover().Stats.PrimaryErrors.Load(), r.App.storeFailover().Stats.Fallbacks.Load())
	}

	// Redis returns (empty: the test server keeps nothing on disk).
	rs.Restart()
	back := time.Now()
	require.Eventually(t, func() bool { return !a.degraded() && !b.degraded() }, 15*time.Second, 10*time.Millisecond, "both replicas switch back")
	t.Logf("both replicas back on Redis %v after it returned", time.Since(back))

	// Sharing resumes: a new captcha through A is replayed by B…
	before = fake.Submits()
	id := taskID(t, a.postForm(t, "/in.php", imageForm(keyA, 123, false), nil))
	r = b.postForm(t, "/in.php", imageForm(keyA, 123, false), nil)
	require.Equal(t, id, taskID(t, r))
	require.Equal(t, "replayed", r.Outcome)
	require.EqualValues(t, before+1, fake.Submits())
	// …and the captcha of the outage now has one task fleet-wide: the
	// replicas copied their local entries back (first one wins).
	ra, rb := a.postForm(t, "/in.php", imageForm(keyA, 99, false), nil), b.postForm(t, "/in.php", imageForm(keyA, 99, false), nil)
	require.Equal(t, "replayed", ra.Outcome)
	require.Equal(t, "replayed", rb.Outcome)
	require.Equal(t, taskID(t, ra), taskID(t, rb))
	require.EqualValues(t, before+1, fake.Submits())
}

// A Redis that hangs (accepts, never answers) costs each replica one
// store timeout, not a client error, and sharing resumes when it flows.
func TestRedisStalls(t *testing.T) {
	rs := redistest.Start(t)
	fake := captchaaitest.NewServer(t)
	link := newRedisLink(t, rs.Addr())
	a := startReplica(t, "replica A", fake, link.Addr(), func(c *config.File) { c.Store.Timeout = 100 * time.Millisecond })
	b := startReplica(t, "replica B", fake, rs.Addr(), nil)
	taskID(t, a.postForm(t, "/in.php", imageForm(keyA, 1, false), nil)) // warm connections

	link.Stall()
	start := time.Now()
	r := a.postForm(t, "/in.php", imageForm(keyA, 2, false), nil)
	took := time.Since(start)
	require.True(t, strings.HasPrefix(r.Body, "OK|"), r.Body)
	t.Logf("submission with Redis stalled took %v", took)
	require.Less(t, took, time.Second, "fail open within a second")
	require.True(t, a.degraded())
	id := taskID(t, a.postForm(t, "/in.php", imageForm(keyA, 3, false), nil))
	require.True(t, strings.HasPrefix(a.pollUntilDone(t, keyA, id).Body, "OK|"))

	link.Flow()
	require.Eventually(t, func() bool { return !a.degraded() }, 10*time.Second, 10*time.Millisecond, "A switches back")
	r = b.postForm(t, "/in.php", imageForm(keyA, 3, false), nil)
	require.Equal(t, id, taskID(t, r), "A's task from the stall is shared after it")
	require.Equal(t, "replayed", r.Outcome)
}

// A replica restarted against the same Redis gives a retry of a submission
// made before the restart the same task ID.
func TestReplicaRestartKeepsDedup(t *testing.T) {
	rs := redistest.Start(t)
	fake := captchaaitest.NewServer(t)
	a := startReplica(t, "replica A", fake, rs.Addr(), nil)
	id := taskID(t, a.postForm(t, "/in.php", imageForm(keyA, 5, true), nil))
	a.stop(t)

	a2 := startReplica(t, "replica A (restarted)", fake, rs.Addr(), nil)
	r := a2.postForm(t, "/in.php", imageForm(keyA, 5, false), nil)
	require.Equal(t, "OK|"+id, r.Body)
	require.Equal(t, "replayed", r.Outcome)
	r = a2.postForm(t, "/in.php", imageForm(keyA, 5, true), nil)
	require.Equal(t, `{"status":1,"request":"`+id+`"}`, r.Body)
	require.EqualValues(t, 1, fake.Submits())
}

// TestRedisSizing measures what one task costs in Redis (MEMORY USAGE of
// each key it leaves), for the README's sizing table.
func TestRedisSizing(t *testing.T) {
	rs := redistest.Start(t)
	fake := captchaaitest.NewServer(t, captchaaitest.SolveAfterPolls(1))
	a := startReplica(t, "replica A", fake, rs.Addr(), nil)
	// A typical image task, solved and polled in both formats, and
	// reported good; a reCAPTCHA token task, solved.
	id := taskID(t, a.postForm(t, "/in.php", imageForm(keyA, 1, false), nil))
	a.pollUntilDone(t, keyA, id)
	a.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}, "json": {"1"}})
	a.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"reportgood"}, "id": {id}})
	tok := taskID(t, a.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
	a.pollUntilDone(t, keyA, tok)

	rdb := rs.Client(t)
	ctx := t.Context()
	keys, err := rdb.Keys(ctx, "solveonce:*").Result()
	require.NoError(t, err)
	sort.Strings(keys)
	total := int64(0)
	for _, k := range keys {
		mem, err := rdb.MemoryUsage(ctx, k).Result()
		require.NoError(t, err)
		val, err := rdb.Get(ctx, k).Result()
		require.NoError(t, err)
		ttl := rdb.PTTL(ctx, k).Val()
		total += mem
		short := k
		if len(short) > 60 {
			short = short[:60] + "…"
		}
		t.Logf("%-62s value %4d B  MEMORY USAGE %4d B  TTL %v", short, len(val), mem, ttl.Round(time.Second))
	}
	t.Logf("%d keys, %d B in all", len(keys), total)
	require.NotEmpty(t, keys)
}

// benchReplayed measures a replayed image submission through the layer
// that build() wires (store and answer cache as configured), and through
// HTTP to the proxy.
func benchReplayed(b *testing.B, mutate func(*config.File)) {
	fake := captchaaitest.NewServer(b)
	cfg := config.Default()
	cfg.DataDir = b.TempDir()
	cfg.Upstream.BaseURL = fake.URL
	cfg.Proxy.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "off"
	mutate(&cfg)
	a, err := build(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer a.close()
	body := []byte(imageForm(keyA, 1, false).Encode())
	hdr := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	ctx := context.Background()
	if _, err := a.layer.Submit(ctx, captchaai.Parse(http.MethodPost, "/in.php", "", hdr, body)); err != nil {
		b.Fatal(err)
	}
	b.Run("layer", func(b *testing.B) {
		r := captchaai.Parse(http.MethodPost, "/in.php", "", hdr, body)
		b.ReportAllocs()
		for b.Loop() {
			s, err := a.layer.Submit(ctx, r)
			if err != nil || s.Outcome.String() != "replayed" {
				b.Fatalf("%v %v", s, err)
			}
		}
	})
	b.Run("http", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		hs := &http.Server{Handler: a.handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		defer func() { _ = hs.Shutdown(context.Background()) }()
		tr := &http.Transport{Proxy: nil}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		u := "http://" + ln.Addr().String() + "/in.php"
		b.ReportAllocs()
		for b.Loop() {
			res, err := c.Post(u, "application/x-www-form-urlencoded", strings.NewReader(string(body)))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.Header.Get("X-Solveonce") != "replayed" {
				b.Fatalf("outcome %q", res.Header.Get("X-Solveonce"))
			}
		}
	})
	if err := a.layer.Wait(ctx); err != nil {
		b.Fatal(err)
	}
	if n := fake.Submits(); n != 1 {
		b.Fatalf("upstream submits = %d", n)
	}
}

func BenchmarkReplayedSubmitMemory(b *testing.B) {
	benchReplayed(b, func(*config.File) {})
}

func BenchmarkReplayedSubmitRedis(b *testing.B) {
	rs := redistest.Start(b)
	benchReplayed(b, func(c *config.File) {
		c.Store.Kind = "redis"
		c.Store.RedisURL = "redis://" + rs.Addr() + "/0"
	})
}

// The Redis URL forms select the matching go-redis client, keep the
// password out of errors, and reject what go-redis rejects.
func TestRedisClientFromURL(t *testing.T) {
	for _, tc := range []struct {
		url, want string
	}{
		{"redis://127.0.0.1:6379/0", "*redis.Client"},
		{"rediss://user@cache.example:6380/2?pool_size=5", "*redis.Client"},
		{"redis://s1:26379/0?master_name=mymaster&addr=s2:26379", "*redis.Client"}, // sentinel-backed failover client
		{"redis://n1:6379?addr=n2:6379&addr=n3:6379", "*redis.ClusterClient"},
		{"redis://n1:6379?cluster=true", "*redis.ClusterClient"},
	} {
		c, err := newRedisClient(config.Store{RedisURL: tc.url}, "secret")
		require.NoError(t, err, tc.url)
		require.Equal(t, tc.want, fmt.Sprintf("%T", c), tc.url)
		require.NoError(t, c.Close())
	}
	// Unset timeouts are made short, set ones kept; commands honour their
	// context's deadline; the environment's password wins.
	c, err := newRedisClient(config.Store{RedisURL: "redis://:inurl@h:1/3?dial_timeout=3s", Timeout: 100 * time.Millisecond}, "fromenv")
	require.NoError(t, err)
	defer c.Close()
	o := c.(*redis.Client).Options()
	require.True(t, o.ContextTimeoutEnabled)
	require.Equal(t, 3*time.Second, o.DialTimeout)
	require.Equal(t, 100*time.Millisecond, o.ReadTimeout)
	require.Equal(t, 100*time.Millisecond, o.PoolTimeout)
	require.Equal(t, "fromenv", o.Password)
	require.Equal(t, 3, o.DB)

	_, err = newRedisClient(config.Store{RedisURL: "redis://:hunter2@h:1/0?bogus=1"}, "")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
	t.Logf("bad URL: %v", err)
}
