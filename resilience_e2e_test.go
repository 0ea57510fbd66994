package main

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
)

// Under a full outage the breaker opens, upstream stops being called while
// 50 clients keep submitting and polling, and those clients get answers
// they already understand (ERROR_NO_SLOT_AVAILABLE with Retry-After,
// CAPCHA_NOT_READY), never an HTTP 5xx. When the outage ends, a half-open
// probe goes out and traffic recovers.
func TestOutageFailsFastInProtocolWords(t *testing.T) {
	s := startStack(t, func(c *config.File) {
		c.Breaker.OpenFor = 700 * time.Millisecond
		c.Upstream.BackoffBase = 5 * time.Millisecond
		c.Upstream.BackoffCap = 20 * time.Millisecond
	}, captchaaitest.SolveAfterPolls(1_000_000))
	// A task that is alive before the outage.
	id := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 1, false), nil))

	s.Fake.SetOutage(true)
	round := func(n int) (noSlot, notReady int) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for c := range 50 {
			wg.Go(func() {
				sub := s.postForm(t, "/in.php", imageForm(keyA, 100+n*50+c, false), nil)
				poll := s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "id": {id}})
				require.Equal(t, http.StatusOK, sub.Status)
				require.Equal(t, http.StatusOK, poll.Status)
				mu.Lock()
				defer mu.Unlock()
				if sub.Body == "ERROR_NO_SLOT_AVAILABLE" {
					require.NotEmpty(t, sub.Header.Get("Retry-After"))
					noSlot++
				}
				if poll.Body == "CAPCHA_NOT_READY" {
					notReady++
				}
			})
		}
		wg.Wait()
		return noSlot, notReady
	}
	noSlot, notReady := round(0)
	require.Equal(t, 50, noSlot)
	require.Equal(t, 50, notReady)
	require.Equal(t, "open", s.App.layerCircuitState())
	calls := s.Fake.Requests()
	for n := 1; n <= 3; n++ {
		noSlot, notReady = round(n)
		require.Equal(t, 50, noSlot)
		require.Equal(t, 50, notReady)
	}
	require.Equal(t, calls, s.Fake.Requests(), "no upstream calls while the circuit is open")

	s.Fake.SetOutage(false)
	require.Eventually(t, func() bool {
		r := s.postForm(t, "/in.php", imageForm(keyA, 9_999, false), nil)
		return strings.HasPrefix(r.Body, "OK|")
	}, 10*time.Second, 100*time.Millisecond, "traffic recovers after the cool-down")
	require.Equal(t, "closed", s.App.layerCircuitState())
}
