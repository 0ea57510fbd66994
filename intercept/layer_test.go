package intercept_test

import (
	"context"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

// replicas builds n Layers (as n replicas would be) sharing one index.
func replicas(t *testing.T, n int, idx store.Index, cfg intercept.Config, opts ...captchaaitest.Option) ([]*intercept.Layer, *captchaaitest.Server) {
	t.Helper()
	fake := captchaaitest.NewServer(t, opts...)
	var ls []*intercept.Layer
	for i := range n {
		up, err := upstream.New(upstream.Config{BaseURL: fake.URL}, breaker.New("test", breaker.Config{}, upstream.IsFailure), nil)
		require.NoError(t, err)
		answers, err := cache.New(cache.Config{})
		require.NoError(t, err)
		t.Cleanup(answers.Close)
		ls = append(ls, intercept.New(cfg, up, answers, idx, intercept.WithReplica(string(rune('a'+i)))))
	}
	return ls, fake
}

func tokenReq(pageurl string) *captchaai.Request {
	q := url.Values{"key": {benchKey}, "method": {"userrecaptcha"}, "googlekey": {"sitekey"}, "pageurl": {pageurl}}
	return captchaai.Parse(http.MethodGet, "/in.php", q.Encode(), http.Header{}, nil)
}

// Identical submissions spread over replicas sharing an index make one
// upstream task: the losers of the claim wait for the winner's task ID.
func TestReplicasShareOneClaim(t *testing.T) {
	ls, fake := replicas(t, 3, store.NewMemory(store.MemoryConfig{}), intercept.Config{}, captchaaitest.Latency(100*time.Millisecond))
	var wg sync.WaitGroup
	ids := make([]string, 60)
	for i := range ids {
		wg.Go(func() {
			s, err := ls[i%3].Submit(context.Background(), submitReq([]byte("shared picture")))
			require.NoError(t, err)
			ids[i] = s.Task()
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, fake.Submits())
	for _, id := range ids {
		require.Equal(t, ids[0], id)
	}
}

// An orphaned token submission (its only client left before the answer) is
// handed to the retry, also when the retry lands on another replica.
func TestOrphanHandedToRetryOnAnotherReplica(t *testing.T) {
	ls, fake := replicas(t, 2, store.NewMemory(store.MemoryConfig{}), intercept.Config{}, captchaaitest.Latency(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := ls[0].Submit(ctx, tokenReq("https://example.com/a"))
	require.Error(t, err)
	require.NoError(t, ls[0].Wait(context.Background()))
	s, err := ls[1].Submit(context.Background(), tokenReq("https://example.com/a"))
	require.NoError(t, err)
	require.Equal(t, intercept.Replayed, s.Outcome)
	require.EqualValues(t, 1, fake.Submits())

	// Delivered to a live client now: a third identical submission gets its own.
	ls[1].Delivered(context.Background(), s)
	s2, err := ls[0].Submit(context.Background(), tokenReq("https://example.com/a"))
	require.NoError(t, err)
	require.NotEqual(t, s.Task(), s2.Task())
	require.EqualValues(t, 2, fake.Submits())
}

// A client that leaves while the shared submission is still in flight
// frees it for an identical submission arriving later on the same replica.
func TestLeavingHolderFreesFlight(t *testing.T) {
	ls, fake := replicas(t, 1, store.NewMemory(store.MemoryConfig{}), intercept.Config{}, captchaaitest.Latency(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := ls[0].Submit(ctx, tokenReq("https://example.com/b"))
	require.Error(t, err)
	s, err := ls[0].Submit(context.Background(), tokenReq("https://example.com/b"))
	require.NoError(t, err)
	require.Equal(t, intercept.Shared, s.Outcome, "joins the orphaned flight")
	require.EqualValues(t, 1, fake.Submits())
}

// An upstream failure is shared with every waiter and not remembered.
func TestFailureSharedNotRemembered(t *testing.T) {
	ls, fake := replicas(t, 2, store.NewMemory(store.MemoryConfig{}), intercept.Config{}, captchaaitest.Latency(300*time.Millisecond))
	fake.FailCode("in.php", 1, "ERROR_ZERO_CAPTCHA_FILESIZE")
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			s, err := ls[i%2].Submit(context.Background(), submitReq([]byte("bad picture")))
			require.NoError(t, err)
			require.Equal(t, captchaai.StatusError, s.Answer.Status)
			require.Equal(t, "ERROR_ZERO_CAPTCHA_FILESIZE", s.Answer.Value)
		})
	}
	wg.Wait()
	s, err := ls[0].Submit(context.Background(), submitReq([]byte("bad picture")))
	require.NoError(t, err)
	require.Equal(t, captchaai.StatusOK, s.Answer.Status)
	require.EqualValues(t, 1, fake.Submits())
}

// recorder is a Pingbacks sink that remembers subscriptions.
type recorder struct {
	mu   sync.Mutex
	urls []string
}

func (r *recorder) Subscribe(_ context.Context, s intercept.Subscription) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.urls = append(r.urls, s.URL)
}

// Merged submissions' pingbacks are handed over, except the URL CaptchaAI
// already calls for the task (the creating submission's own).
func TestMergedPingbacksSubscribed(t *testing.T) {
	fake := captchaaitest.NewServer(t)
	rec := &recorder{}
	up, err := upstream.New(upstream.Config{BaseURL: fake.URL}, nil, nil)
	require.NoError(t, err)
	answers, err := cache.New(cache.Config{})
	require.NoError(t, err)
	t.Cleanup(answers.Close)
	l := intercept.New(intercept.Config{}, up, answers, store.NewMemory(store.MemoryConfig{}), intercept.WithPingbacks(rec))
	with := func(pb string) *captchaai.Request {
		r := submitReq([]byte("pingback picture"))
		q := url.Values{"key": {benchKey}, "method": {"post"}, "pingback": {pb}}
		r2 := captchaai.Parse(http.MethodPost, "/in.php", q.Encode(), r.Header, r.Body)
		return r2
	}
	for _, pb := range []string{"http://127.0.0.1:1/a", "http://127.0.0.1:1/a", "http://127.0.0.1:1/b", "http://127.0.0.1:1/c"} {
		_, err := l.Submit(context.Background(), with(pb))
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, fake.Submits())
	require.Equal(t, []string{"http://127.0.0.1:1/b", "http://127.0.0.1:1/c"}, rec.urls)
}
