package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/intercept"
)

// 200 concurrent identical image submissions make one upstream task, and
// every client gets it in the format it asked for.
func TestConcurrentIdenticalSubmissionsShareOneTask(t *testing.T) {
	s := startStack(t, nil, captchaaitest.Latency(200*time.Millisecond))
	const n = 200
	var wg sync.WaitGroup
	ids := make([]string, n)
	bodies := make([]string, n)
	for i := range n {
		wg.Go(func() {
			r := s.postForm(t, "/in.php", imageForm(keyA, 1, i%2 == 1), nil)
			require.Equal(t, http.StatusOK, r.Status)
			bodies[i] = r.Body
			ids[i] = taskID(t, r)
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, s.Fake.Submits(), "one upstream task for 200 identical submissions")
	for i := range n {
		require.Equal(t, ids[0], ids[i])
		if i%2 == 1 {
			require.Equal(t, `{"status":1,"request":"`+ids[0]+`"}`, bodies[i])
		} else {
			require.Equal(t, "OK|"+ids[0], bodies[i])
		}
	}
}

// 100 distinct captchas make 100 tasks and each client gets its own answer.
func TestDistinctCaptchasAreNeverMerged(t *testing.T) {
	s := startStack(t, nil)
	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 1000+i, false), nil))
			r := s.pollUntilDone(t, keyA, id)
			require.Equal(t, "OK|"+captchaaitest.ImageAnswer(image(1000+i)), r.Body)
		})
	}
	wg.Wait()
	require.EqualValues(t, n, s.Fake.Submits())
}

// The same captcha under two API keys makes two tasks; neither key can
// read the other's (cached) answer.
func TestAPIKeysArePartitions(t *testing.T) {
	s := startStack(t, nil)
	idA := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 7, false), nil))
	idB := taskID(t, s.postForm(t, "/in.php", imageForm(keyB, 7, false), nil))
	require.NotEqual(t, idA, idB)
	require.EqualValues(t, 2, s.Fake.Submits())
	require.True(t, strings.HasPrefix(s.pollUntilDone(t, keyA, idA).Body, "OK|"))
	// A's answer is cached now; B asking for A's task must not get it.
	r := s.get(t, "/res.php", url.Values{"key": {keyB}, "action": {"get"}, "id": {idA}})
	require.Equal(t, "ERROR_WRONG_CAPTCHA_ID", r.Body)
	require.NotEqual(t, "hit", r.Outcome)
}

// A multipart file upload and a base64 body of the same picture are one
// captcha.
func TestMultipartAndBase64OfOneImageCollide(t *testing.T) {
	s := startStack(t, nil)
	id1 := taskID(t, s.postFile(t, keyA, image(3), nil))
	v := imageForm(keyA, 3, false)
	v.Set("body", "data:image/png;base64,"+base64.StdEncoding.EncodeToString(image(3)))
	r := s.postForm(t, "/in.php", v, nil)
	require.Equal(t, id1, taskID(t, r))
	require.Equal(t, "replayed", r.Outcome)
	require.EqualValues(t, 1, s.Fake.Submits())
}

// Under the orphans policy (token captchas), a client that disconnected
// before its submit answer and retries gets the same task; two live
// clients get two tasks; a task whose token was fetched is never reused.
func TestOrphansPolicy(t *testing.T) {
	t.Run("retry after disconnect reuses the task", func(t *testing.T) {
		s := startStack(t, nil, captchaaitest.Latency(300*time.Millisecond))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/in.php", strings.NewReader(tokenForm(keyA, "https://example.com/login").Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		_, err := s.http.Do(req)
		require.Error(t, err, "the client gave up before the answer")
		require.Eventually(t, func() bool { return s.Fake.Submits() == 1 }, 5*time.Second, 10*time.Millisecond)
		time.Sleep(400 * time.Millisecond) // let the abandoned submission land in the index
		r := s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/login"), nil)
		require.Equal(t, "replayed", r.Outcome)
		require.EqualValues(t, 1, s.Fake.Submits(), "the retry must not pay again")
	})
	t.Run("two live clients get two tasks", func(t *testing.T) {
		s := startStack(t, nil, captchaaitest.Latency(100*time.Millisecond))
		var wg sync.WaitGroup
		ids := make([]string, 2)
		for i := range 2 {
			wg.Go(func() { ids[i] = taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil)) })
		}
		wg.Wait()
		require.NotEqual(t, ids[0], ids[1])
		// And sequentially: the first client holds its task (it polls).
		id3 := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
		require.NotContains(t, ids, id3)
		require.EqualValues(t, 3, s.Fake.Submits())
	})
	t.Run("fetched token is never handed out again", func(t *testing.T) {
		s := startStack(t, func(c *config.File) {
			p := c.Intercept.Policies["userrecaptcha"]
			p.OrphanAfter = 200 * time.Millisecond
			c.Intercept.Policies["userrecaptcha"] = p
		}, captchaaitest.SolveAfterPolls(1))
		id := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/x"), nil))
		require.True(t, strings.HasPrefix(s.pollUntilDone(t, keyA, id).Body, "OK|TOKEN-"))
		time.Sleep(300 * time.Millisecond) // past orphan_after: silent, but fetched
		id2 := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/x"), nil))
		require.NotEqual(t, id, id2)
	})
	t.Run("silent delivered task becomes an orphan", func(t *testing.T) {
		s := startStack(t, func(c *config.File) {
			p := c.Intercept.Policies["userrecaptcha"]
			p.OrphanAfter = 200 * time.Millisecond
			c.Intercept.Policies["userrecaptcha"] = p
		})
		id := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/y"), nil))
		time.Sleep(300 * time.Millisecond) // the client crashed: no poll
		r := s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/y"), nil)
		require.Equal(t, id, taskID(t, r))
		require.Equal(t, "replayed", r.Outcome)
	})
	t.Run("always merges live clients", func(t *testing.T) {
		s := startStack(t, func(c *config.File) {
			c.Intercept.Policies["userrecaptcha"] = intercept.Policy{Reuse: intercept.ReuseAlways}
		})
		id1 := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
		id2 := taskID(t, s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/"), nil))
		require.Equal(t, id1, id2)
		require.EqualValues(t, 1, s.Fake.Submits())
	})
}

// Idempotency-Key merges exactly the submissions that carry the same key.
func TestIdempotencyKey(t *testing.T) {
	s := startStack(t, nil)
	h := func(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }
	form := tokenForm(keyA, "https://example.com/idem")
	id1 := taskID(t, s.postForm(t, "/in.php", form, h("job-1")))
	id1b := taskID(t, s.postForm(t, "/in.php", form, h("job-1")))
	id2 := taskID(t, s.postForm(t, "/in.php", form, h("job-2")))
	require.Equal(t, id1, id1b)
	require.NotEqual(t, id1, id2)
	// The same key for another captcha is a clear error.
	r := s.postForm(t, "/in.php", tokenForm(keyA, "https://example.com/other"), h("job-1"))
	require.Equal(t, http.StatusUnprocessableEntity, r.Status)
	require.Equal(t, "ERROR_BAD_PARAMETERS", r.Body)
	// Scoped per API key.
	id3 := taskID(t, s.postForm(t, "/in.php", tokenForm(keyB, "https://example.com/idem"), h("job-1")))
	require.NotEqual(t, id1, id3)
	require.EqualValues(t, 3, s.Fake.Submits())
	// Cache-Control: no-cache forces a fresh task even for an image.
	a := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 9, false), nil))
	b := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 9, false), http.Header{"Cache-Control": {"no-cache"}}))
	require.NotEqual(t, a, b)
}

// An upstream error is never recorded as a task: the next identical
// submission tries again.
func TestUpstreamErrorIsNotCached(t *testing.T) {
	s := startStack(t, nil)
	s.Fake.FailCode("in.php", 1, "ERROR_IMAGE_TYPE_NOT_SUPPORTED")
	r := s.postForm(t, "/in.php", imageForm(keyA, 4, false), nil)
	require.Equal(t, "ERROR_IMAGE_TYPE_NOT_SUPPORTED", r.Body)
	id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 4, false), nil))
	require.NotEmpty(t, id)
	require.EqualValues(t, 1, s.Fake.Submits())
}

// ERROR_CAPTCHA_UNSOLVABLE and reportbad evict the task from the index.
func TestUnsolvableAndReportBadEvict(t *testing.T) {
	var calls atomic.Int64
	s := startStack(t, nil, captchaaitest.SolveAfterPolls(1), captchaaitest.Answerer(func(tk captchaaitest.Task) (string, string) {
		if calls.Add(1) == 1 {
			return "", "ERROR_CAPTCHA_UNSOLVABLE"
		}
		return "answer-" + tk.ID, ""
	}))
	id1 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 5, false), nil))
	require.Equal(t, "ERROR_CAPTCHA_UNSOLVABLE", s.pollUntilDone(t, keyA, id1).Body)
	id2 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 5, false), nil))
	require.NotEqual(t, id1, id2, "unsolvable evicts")
	require.Equal(t, "OK|answer-"+id2, s.pollUntilDone(t, keyA, id2).Body)
	// reportbad is forwarded once per task, answered with CaptchaAI's empty 200.
	for range 3 {
		r := s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"reportbad"}, "id": {id2}})
		require.Equal(t, http.StatusOK, r.Status)
		require.Empty(t, r.Body)
	}
	require.EqualValues(t, 1, s.Fake.Reports())
	id3 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 5, false), nil))
	require.NotEqual(t, id2, id3, "reportbad evicts")
}

// 50 clients polling one task every 100 ms for 10 s cause about 5 upstream
// polls (pending_ttl 2 s), not 5,000.
func TestPollStormCollapses(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 10 s")
	}
	s := startStack(t, func(c *config.File) { c.Cache.PendingTTL = 2 * time.Second }, captchaaitest.SolveAfterPolls(1_000_000))
	id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 6, false), nil))
	var wg sync.WaitGroup
	var clientPolls atomic.Int64
	deadline := time.Now().Add(10 * time.Second)
	for c := range 50 {
		wg.Go(func() {
			json := c%2 == 0
			for time.Now().Before(deadline) {
				v := url.Values{"key": {keyA}, "action": {"get"}, "id": {id}}
				if json {
					v.Set("json", "1")
				}
				r := s.get(t, "/res.php", v)
				if json {
					require.Equal(t, `{"status":0,"request":"CAPCHA_NOT_READY"}`, r.Body)
				} else {
					require.Equal(t, "CAPCHA_NOT_READY", r.Body)
				}
				clientPolls.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	up := s.Fake.PollsFor(id)
	t.Logf("%d client polls, %d upstream polls", clientPolls.Load(), up)
	require.Greater(t, clientPolls.Load(), int64(2000))
	require.LessOrEqual(t, up, int64(7), "about one upstream poll per pending_ttl")
}

// Every error code of the protocol doc's tables passes through byte-exact,
// in both formats, on both endpoints, except where the resilience rules say
// otherwise: an in.php server error is ambiguous (the task may exist) and is
// answered with the documented "retry later" (ERROR_NO_SLOT_AVAILABLE), and
// a transient res.php code (server error, capacity) is absorbed as
// CAPCHA_NOT_READY so clients keep polling instead of aborting.
func TestErrorCodesPassThroughByteExact(t *testing.T) {
	s := startStack(t, func(c *config.File) { c.Upstream.MaxAttempts = 1 })
	for i, code := range captchaai.Codes() {
		for _, json := range []bool{false, true} {
			// A fresh key per case: account codes are remembered per key.
			key := fmt.Sprintf("%032x", 1_000+i*2+map[bool]int{false: 0, true: 1}[json])
			render := func(code string) string {
				if json {
					return `{"status":0,"request":"` + code + `"}`
				}
				return code
			}
			class := captchaai.Classify(code)
			want := render(code)
			if class == captchaai.ClassServer {
				want = render(captchaai.CodeNoSlot)
			}
			s.Fake.FailCode("in.php", 1, code)
			v := imageForm(key, 10_000+i, json)
			r := s.postForm(t, "/in.php", v, nil)
			require.Equal(t, want, r.Body, "in.php %s json=%v", code, json)
			require.Equal(t, http.StatusOK, r.Status)
			want = render(code)
			if class == captchaai.ClassServer || class == captchaai.ClassCapacity {
				want = render(captchaai.NotReady)
			}

			key2 := fmt.Sprintf("%032x", 50_000+i*2+map[bool]int{false: 0, true: 1}[json])
			id := taskID(t, s.postForm(t, "/in.php", imageForm(key2, 20_000+i, json), nil))
			s.Fake.FailCode("res.php", 1, code)
			pv := url.Values{"key": {key2}, "action": {"get"}, "id": {id}}
			if json {
				pv.Set("json", "1")
			}
			r = s.get(t, "/res.php", pv)
			require.Equal(t, want, r.Body, "res.php %s json=%v", code, json)
			require.Equal(t, http.StatusOK, r.Status)
		}
	}
}
