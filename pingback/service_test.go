package pingback

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/intercept"
)

const testKey = "0123456789abcdef0123456789abcdef"

var testAcct = captchaai.AccountOf(testKey)

// fakePoller answers polls: CAPCHA_NOT_READY for the first notReady polls of
// a task, then the answer (or code).
type fakePoller struct {
	mu       sync.Mutex
	notReady int
	code     string // terminal error code instead of an answer
	polls    map[string]int
	times    map[string][]time.Time
}

func newPoller(notReady int) *fakePoller {
	return &fakePoller{notReady: notReady, polls: map[string]int{}, times: map[string][]time.Time{}}
}

func (p *fakePoller) Result(_ context.Context, r *captchaai.Request) (captchaai.Answer, intercept.Outcome, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Key() != testKey || r.Kind != captchaai.KindResult || r.Format != captchaai.FormatText {
		return captchaai.Text("ERROR_WRONG_USER_KEY"), intercept.Miss, nil
	}
	p.polls[r.ID]++
	p.times[r.ID] = append(p.times[r.ID], time.Now())
	if p.polls[r.ID] <= p.notReady {
		return captchaai.Text(captchaai.NotReady), intercept.Miss, nil
	}
	if p.code != "" {
		return captchaai.Text(p.code), intercept.Miss, nil
	}
	return captchaai.OK("ANS-" + r.ID), intercept.Miss, nil
}

func (p *fakePoller) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.polls[id]
}

// receivers fakes every pingback receiver, in process (usable in a
// synctest bubble). A URL's behaviour is set with on.
type receivers struct {
	mu       sync.Mutex
	got      map[string][]string // base URL → delivered "id=…&code=…"
	tries    map[string]int
	behave   map[string]func(n int) (status int, err error, hang bool)
	inflight map[string]int // by host
	maxIn    map[string]int
}

func newReceivers() *receivers {
	return &receivers{got: map[string][]string{}, tries: map[string]int{}, behave: map[string]func(int) (int, error, bool){},
		inflight: map[string]int{}, maxIn: map[string]int{}}
}

func (rc *receivers) on(base string, f func(n int) (int, error, bool)) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.behave[base] = f
}

func (rc *receivers) RoundTrip(r *http.Request) (*http.Response, error) {
	base := r.URL.Scheme + "://" + r.URL.Host + r.URL.Path
	rc.mu.Lock()
	rc.tries[base]++
	n := rc.tries[base]
	rc.inflight[r.URL.Host]++
	rc.maxIn[r.URL.Host] = max(rc.maxIn[r.URL.Host], rc.inflight[r.URL.Host])
	f := rc.behave[base]
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		rc.inflight[r.URL.Host]--
		rc.mu.Unlock()
	}()
	status, err, hang := 200, error(nil), false
	if f != nil {
		status, err, hang = f(n)
	}
	if hang {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	if err != nil {
		return nil, err
	}
	if status/100 == 2 {
		rc.mu.Lock()
		rc.got[base] = append(rc.got[base], r.URL.RawQuery)
		rc.mu.Unlock()
	}
	return respond(r, status, strings.NewReader("thanks")), nil
}

func (rc *receivers) delivered(base string) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.got[base]...)
}

func (rc *receivers) attempts(base string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.tries[base]
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// start opens a Service on dir with the fake receivers and poller.
func start(t *testing.T, cfg Config, dir string, rc *receivers, p Poller) *Service {
	t.Helper()
	s, err := New(cfg, dir, WithTransport(rc), WithLogger(quiet), withoutControl())
	require.NoError(t, err)
	s.Start(p)
	return s
}

func sub(task, url string) intercept.Subscription {
	return intercept.Subscription{Key: testKey, Account: testAcct, Task: task, Method: "base64", URL: url}
}

func shutdown(t *testing.T, s *Service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx))
}

// Every distinct URL of a task gets the answer once, after polls at the
// configured pace; a repeated URL is one subscriber.
func TestFanOut(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(2)
		s := start(t, DefaultConfig(), dir, rc, p)
		t0 := time.Now()
		for _, u := range []string{"http://a.test/cb", "http://b.test/cb?c=1", "http://c.test/x", "http://a.test/cb"} {
			s.Subscribe(context.Background(), sub("100", u))
		}
		require.EqualValues(t, 1, s.Stats.Duplicates.Load())
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Equal(t, []string{"id=100&code=ANS-100"}, rc.delivered("http://a.test/cb"))
		require.Equal(t, []string{"c=1&id=100&code=ANS-100"}, rc.delivered("http://b.test/cb"))
		require.Equal(t, []string{"id=100&code=ANS-100"}, rc.delivered("http://c.test/x"))
		require.Equal(t, 3, p.count("100"), "one poll stream per task, not per subscriber")
		p.mu.Lock()
		times := p.times["100"]
		p.mu.Unlock()
		require.Equal(t, 5*time.Second, times[0].Sub(t0), "first poll after the image solve time")
		require.Equal(t, 5*time.Second, times[1].Sub(times[0]), "polite interval")
		require.EqualValues(t, 3, s.Stats.Delivered.Load())
		require.Zero(t, s.Held())

		// A late subscriber of a solved task gets the remembered answer at
		// once, without a poll; a repeat of a delivered one gets nothing.
		s.Subscribe(context.Background(), sub("100", "http://d.test/late"))
		s.Subscribe(context.Background(), sub("100", "http://a.test/cb"))
		synctest.Wait()
		require.Len(t, rc.delivered("http://d.test/late"), 1)
		require.Len(t, rc.delivered("http://a.test/cb"), 1)
		require.Equal(t, 3, p.count("100"))
		shutdown(t, s)
	})
}

// Error answers are delivered as the code, as 2captcha does.
func TestErrorAnswerDelivered(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		p.code = captchaai.CodeUnsolvable
		s := start(t, DefaultConfig(), dir, rc, p)
		s.Subscribe(context.Background(), sub("7", "http://a.test/cb"))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, []string{"id=7&code=ERROR_CAPTCHA_UNSOLVABLE"}, rc.delivered("http://a.test/cb"))
		shutdown(t, s)
	})
}

// A receiver down for its first three attempts gets the answer on the
// fourth, after exponential, jittered waits.
func TestRetryWithBackoff(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		var at []time.Time
		rc.on("http://a.test/cb", func(n int) (int, error, bool) {
			at = append(at, time.Now())
			switch n {
			case 1:
				return 0, errors.New("connection refused"), false
			case 2:
				return 503, nil, false
			case 3:
				return 0, nil, true // hangs past the timeout
			}
			return 200, nil, false
		})
		cfg := DefaultConfig()
		s := start(t, cfg, dir, rc, p)
		s.Subscribe(context.Background(), sub("1", "http://a.test/cb"))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.Len(t, rc.delivered("http://a.test/cb"), 1)
		require.Len(t, at, 4)
		require.EqualValues(t, 3, s.Stats.Retries.Load())
		require.EqualValues(t, 4, s.Stats.Attempts.Load())
		// Waits: [0.5,1]s, [1,2]s, then the 5s timeout plus [2,4]s.
		within := func(d, lo, hi time.Duration) {
			t.Helper()
			require.True(t, d >= lo && d <= hi, "%v not within [%v, %v]", d, lo, hi)
		}
		within(at[1].Sub(at[0]), 500*time.Millisecond, time.Second)
		within(at[2].Sub(at[1]), time.Second, 2*time.Second)
		within(at[3].Sub(at[2]), cfg.Timeout+2*time.Second, cfg.Timeout+4*time.Second)
		shutdown(t, s)
	})
}

// A receiver down past max_age lands in the dead-letter queue, which
// survives a restart; replay delivers it once the receiver is back, once.
func TestDeadLetterRestartReplay(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		down := true
		var mu sync.Mutex
		rc.on("http://a.test/cb", func(int) (int, error, bool) {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return 502, nil, false
			}
			return 200, nil, false
		})
		cfg := DefaultConfig()
		s := start(t, cfg, dir, rc, p)
		s.Subscribe(context.Background(), sub("9", "http://a.test/cb"))
		time.Sleep(cfg.FirstPollImage + cfg.MaxAge - time.Second)
		synctest.Wait()
		require.Zero(t, s.DeadLetters(), "still retrying within max_age")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.EqualValues(t, 1, s.DeadLetters())
		require.EqualValues(t, 1, s.Stats.DeadLettered.Load())
		attempts := rc.attempts("http://a.test/cb")
		require.Greater(t, attempts, 5)
		require.Less(t, attempts, 30, "backoff is exponential, capped at 1m")
		shutdown(t, s)

		// Restart: the entry is still there, with its answer and no key.
		s = start(t, cfg, dir, rc, p)
		entries, err := s.store.DeadLetters()
		require.NoError(t, err)
		require.Len(t, entries, 1)
		e := entries[0]
		require.Equal(t, "ANS-9", e.Code)
		require.Equal(t, testAcct, e.Account)
		require.Equal(t, attempts, e.Attempts)
		require.Contains(t, e.LastError, "502")

		// Replay while the receiver is still down keeps it.
		res, err := s.Replay(context.Background(), nil)
		require.NoError(t, err)
		require.Equal(t, StatusFailed, res[0].Status)
		require.EqualValues(t, 1, s.DeadLetters())

		mu.Lock()
		down = false
		mu.Unlock()
		res, err = s.Replay(context.Background(), []string{e.ID[:8]})
		require.NoError(t, err)
		require.Equal(t, StatusDelivered, res[0].Status, res[0].Reason)
		require.Zero(t, s.DeadLetters())
		require.Equal(t, []string{"id=9&code=ANS-9"}, rc.delivered("http://a.test/cb"))

		// Never twice: not by a new subscription, not after a restart.
		s.Subscribe(context.Background(), sub("9", "http://a.test/cb"))
		synctest.Wait()
		shutdown(t, s)
		s = start(t, cfg, dir, rc, p)
		s.Subscribe(context.Background(), sub("9", "http://a.test/cb"))
		time.Sleep(time.Minute)
		synctest.Wait()
		require.EqualValues(t, 1, s.Stats.Duplicates.Load())
		require.Len(t, rc.delivered("http://a.test/cb"), 1)
		shutdown(t, s)
	})
}

// A 404 is final: dead-lettered at once, not retried.
func TestClientErrorIsFinal(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		rc.on("http://a.test/cb", func(int) (int, error, bool) { return 404, nil, false })
		s := start(t, DefaultConfig(), dir, rc, p)
		s.Subscribe(context.Background(), sub("2", "http://a.test/cb"))
		time.Sleep(10 * time.Second)
		synctest.Wait()
		require.Equal(t, 1, rc.attempts("http://a.test/cb"))
		require.EqualValues(t, 1, s.DeadLetters())
		shutdown(t, s)
	})
}

// 1,000 subscribers on a receiver that never answers hold at most
// host_workers workers: another receiver is served at once, Subscribe
// never waits, and every subscriber is settled within max_age plus a
// timeout.
func TestSlowReceiverIsIsolated(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		cfg := DefaultConfig()
		for i := range 1000 {
			rc.on("http://slow.test/"+itoa(i), func(int) (int, error, bool) { return 0, nil, true })
		}
		s := start(t, cfg, dir, rc, p)
		t0 := time.Now()
		for i := range 1000 {
			s.Subscribe(context.Background(), sub("5", "http://slow.test/"+itoa(i)))
		}
		s.Subscribe(context.Background(), sub("5", "http://fast.test/cb"))
		require.Equal(t, t0, time.Now(), "Subscribe never blocks")
		require.Equal(t, 1001, s.Held())

		time.Sleep(cfg.FirstPollImage + time.Millisecond)
		synctest.Wait()
		require.Len(t, rc.delivered("http://fast.test/cb"), 1, "the fast receiver is not stuck behind the slow one")

		time.Sleep(cfg.MaxAge + cfg.Timeout + time.Second)
		synctest.Wait()
		require.Zero(t, s.Held(), "every subscriber settled in bounded time")
		require.EqualValues(t, 1000, s.DeadLetters())
		rc.mu.Lock()
		require.LessOrEqual(t, rc.maxIn["slow.test"], cfg.HostWorkers)
		rc.mu.Unlock()
		shutdown(t, s)
	})
}

// Subscribers beyond pingback.queue are dead-lettered at once.
func TestQueueOverflow(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		cfg := DefaultConfig()
		cfg.Queue = 2
		s := start(t, cfg, dir, rc, p)
		for i := range 3 {
			s.Subscribe(context.Background(), sub("3", "http://a.test/"+itoa(i)))
		}
		require.EqualValues(t, 1, s.Stats.Overflows.Load())
		synctest.Wait()
		require.EqualValues(t, 1, s.DeadLetters())
		time.Sleep(time.Minute)
		synctest.Wait()
		require.EqualValues(t, 2, s.Stats.Delivered.Load())
		shutdown(t, s)
	})
}

// Shutdown loses nobody: subscribers waiting for an answer or a retry are
// dead-lettered (with the answer when it is known).
func TestShutdownDeadLettersTheRest(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		rc.on("http://down.test/cb", func(int) (int, error, bool) { return 500, nil, false })
		s := start(t, DefaultConfig(), dir, rc, p)
		s.Subscribe(context.Background(), sub("10", "http://down.test/cb"))
		time.Sleep(6 * time.Second) // answered, first attempt failed: waiting to retry
		synctest.Wait()
		s.Subscribe(context.Background(), sub("11", "http://a.test/cb")) // no answer yet
		shutdown(t, s)

		st, err := OpenStore(s.Path(), time.Second)
		require.NoError(t, err)
		entries, err := st.DeadLetters()
		require.NoError(t, err)
		require.Len(t, entries, 2)
		byTask := map[string]Entry{}
		for _, e := range entries {
			byTask[e.Task] = e
		}
		require.Equal(t, "ANS-10", byTask["10"].Code)
		require.Equal(t, "", byTask["11"].Code)
		require.NoError(t, st.Close())

		// Replay cannot deliver an answer it never learnt.
		s = start(t, DefaultConfig(), dir, rc, p)
		res, err := s.Replay(context.Background(), []string{byTask["11"].ID})
		require.NoError(t, err)
		require.Equal(t, StatusSkipped, res[0].Status)
		shutdown(t, s)
	})
}

// Subscribers recorded as pending by a process that died are dead-lettered
// by the next one.
func TestCrashRecovery(t *testing.T) {
	dir := t.TempDir()
	path, err := DefaultConfig().Path(dir)
	require.NoError(t, err)
	st, err := OpenStore(path, time.Second)
	require.NoError(t, err)
	j := &job{acct: testAcct, task: "12", url: "http://a.test/cb", k: subKey(testAcct, "12", "http://a.test/cb")}
	done := &job{acct: testAcct, task: "13", url: "http://a.test/cb", k: subKey(testAcct, "13", "http://a.test/cb")}
	require.NoError(t, st.apply([]jop{{kind: jopPending, entry: j.entry(time.Time{})}, {kind: jopPending, entry: done.entry(time.Time{})}}))
	require.NoError(t, st.MarkDelivered(done.k, time.Now().Add(time.Hour)))
	require.NoError(t, st.Close())

	s, err := New(DefaultConfig(), dir, WithLogger(quiet), withoutControl())
	require.NoError(t, err)
	require.EqualValues(t, 1, s.DeadLetters())
	require.NoError(t, s.Shutdown(context.Background()))
}

// Only one process holds the file.
func TestSecondProcessIsRefused(t *testing.T) {
	dir := t.TempDir()
	s, err := New(DefaultConfig(), dir, WithLogger(quiet), withoutControl())
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Shutdown(context.Background())) }()
	_, err = New(DefaultConfig(), dir, WithLogger(quiet), withoutControl())
	require.ErrorIs(t, err, ErrLocked)
}

func itoa(i int) string { return strconv.Itoa(i) }

// The collectors register on one registry and report the counters.
func TestCollectors(t *testing.T) {
	s, err := New(DefaultConfig(), t.TempDir(), WithLogger(quiet), withoutControl())
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Shutdown(context.Background())) }()
	s.Stats.Delivered.Add(2)
	reg := prometheus.NewRegistry()
	for _, c := range s.Collectors("solveonce") {
		require.NoError(t, reg.Register(c))
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[name] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	require.Equal(t, 2.0, got["solveonce_pingback_deliveries_total{result=delivered}"])
	require.Contains(t, got, "solveonce_pingback_dead_letters")
	require.Contains(t, got, "solveonce_pingback_subscriptions_total{result=refused}")
}

// A graceful shutdown drains within its deadline: attempts in flight are
// aborted and everything undelivered is dead-lettered, none lost.
func TestShutdownDeadline(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		rc, p := newReceivers(), newPoller(0)
		for i := range 20 {
			rc.on("http://hang.test/"+itoa(i), func(int) (int, error, bool) { return 0, nil, true })
		}
		s := start(t, DefaultConfig(), dir, rc, p)
		for i := range 20 {
			s.Subscribe(context.Background(), sub("20", "http://hang.test/"+itoa(i)))
		}
		s.Subscribe(context.Background(), sub("20", "http://ok.test/cb"))
		time.Sleep(5*time.Second + time.Millisecond) // answered; 4 attempts hang
		synctest.Wait()
		require.Len(t, rc.delivered("http://ok.test/cb"), 1)
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		require.LessOrEqual(t, time.Since(t0), time.Second+100*time.Millisecond, "bounded by the deadline (plus bbolt's batch delay)")
		require.EqualValues(t, 20, s.Stats.DeadLettered.Load())
		st, err := OpenStore(s.Path(), time.Second)
		require.NoError(t, err)
		require.EqualValues(t, 20, st.Len())
		require.NoError(t, st.Close())
	})
}
