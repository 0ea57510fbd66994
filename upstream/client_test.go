package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/stretchr/testify/require"
)

// goodKey is well formed for the fake (32 characters of [0-9a-z]).
const goodKey = "0123456789abcdef0123456789abcdef"

// keyN returns the n-th distinct well-formed key.
func keyN(n int) string { return fmt.Sprintf("%032d", n) }

func submitReq(key string, format captchaai.Format) *captchaai.Request {
	form := url.Values{"key": {key}, "method": {"userrecaptcha"}, "googlekey": {"6Le-test"}, "pageurl": {"https://example.com/login"}}
	if format == captchaai.FormatJSON {
		form.Set("json", "1")
	}
	return captchaai.Parse(http.MethodPost, "/in.php", "",
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, []byte(form.Encode()))
}

func getReq(path string, q url.Values) *captchaai.Request {
	return captchaai.Parse(http.MethodGet, path, q.Encode(), http.Header{}, nil)
}

func pollReq(key, id string, format captchaai.Format) *captchaai.Request {
	q := url.Values{"key": {key}, "action": {"get"}, "id": {id}}
	if format == captchaai.FormatJSON {
		q.Set("json", "1")
	}
	return getReq("/res.php", q)
}

func balanceReq(key string) *captchaai.Request {
	return getReq("/res.php", url.Values{"key": {key}, "action": {"getbalance"}})
}

// newClient builds a Client over rt with a fresh circuit. Inside a synctest
// bubble, call it inside the bubble (the circuit reads the clock).
func newClient(t testing.TB, rt http.RoundTripper, cfg Config, bc breaker.Config) *Client {
	t.Helper()
	if cfg.BaseURL == "" {
		cfg.BaseURL = captchaaitest.InProcessURL
	}
	c, err := New(cfg, breaker.New("captchaai-test", bc, IsFailure), rt)
	require.NoError(t, err)
	c.Logger = slog.New(slog.DiscardHandler)
	return c
}

// submitOK submits one task and returns its ID.
func submitOK(t *testing.T, c *Client, key string) string {
	t.Helper()
	a, err := c.Submit(context.Background(), submitReq(key, captchaai.FormatText))
	require.NoError(t, err)
	require.Equal(t, captchaai.StatusOK, a.Status, "answer %q", a.Raw)
	return a.Value
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// scripted answers the first len(steps) requests with the steps' results,
// then passes requests to next.
func scripted(next http.RoundTripper, steps ...func(*http.Request) (*http.Response, error)) http.RoundTripper {
	var n atomic.Int64
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if i := int(n.Add(1)) - 1; i < len(steps) {
			return steps[i](r)
		}
		return next.RoundTrip(r)
	})
}

func respond(status int, contentType, body string, hdr ...string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		h := http.Header{"Content-Type": {contentType}}
		for i := 0; i+1 < len(hdr); i += 2 {
			h.Set(hdr[i], hdr[i+1])
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
	}
}

func fail(err error) func(*http.Request) (*http.Response, error) {
	return func(*http.Request) (*http.Response, error) { return nil, err }
}

// recorder counts what reaches the upstream transport: when, and how many at
// once.
type recorder struct {
	next http.RoundTripper

	mu          sync.Mutex // guards the fields below
	times       []time.Time
	inFlight    int
	maxInFlight int
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.times = append(r.times, time.Now())
	r.inFlight++
	r.maxInFlight = max(r.maxInFlight, r.inFlight)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inFlight--
		r.mu.Unlock()
	}()
	return r.next.RoundTrip(req)
}

// maxPerWindow returns the most requests seen in any window [t, t+w).
func (r *recorder) maxPerWindow(w time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := 0
	for i, ti := range r.times {
		n := 0
		for _, tj := range r.times[i:] {
			if tj.Sub(ti) < w {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

func TestSubmitRetry(t *testing.T) {
	t.Run("two NO_SLOT then success gives a task ID after 3 submits", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			srv.FailNext("in.php", 2, captchaaitest.FaultNoSlot)

			a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, captchaai.StatusOK, a.Status)
			require.Len(t, a.Value, 11)
			require.EqualValues(t, 3, srv.SubmitRequests())
			require.EqualValues(t, 1, srv.Submits())
			require.EqualValues(t, 2, c.Stats.Retries.Load())
			require.Equal(t, breaker.Closed, c.Circuit().State(), "capacity answers are not failures")
		})
	})

	t.Run("NO_SLOT exhausted returns the protocol answer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{MaxAttempts: 2}, breaker.Config{})
			srv.FailNext("in.php", 5, captchaaitest.FaultNoSlot)
			a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatJSON))
			require.NoError(t, err)
			require.Equal(t, captchaai.CodeNoSlot, a.Value)
			require.Equal(t, captchaai.FormatJSON, a.Format)
			require.EqualValues(t, 2, srv.SubmitRequests())
		})
	})

	for _, tc := range []struct {
		name    string
		fault   captchaaitest.Fault
		created int64 // tasks the fake created: why a resend would pay twice
	}{
		{"HTML 500 after the body was sent is not retried", captchaaitest.FaultHTML500, 1},
		{"HTML 502 is not retried", captchaaitest.FaultHTML502, 0},
		{"ERROR_SERVER_ERROR is not retried", captchaaitest.FaultServerError, 0},
		{"reset after the body was sent is not retried", captchaaitest.FaultResetAfter, 1},
		{"reset is not retried (nothing proves it was not read)", captchaaitest.FaultReset, 0},
		{"timeout after the body was sent is not retried", captchaaitest.FaultTimeout, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := captchaaitest.NewInProcess(t)
				c := newClient(t, srv.Transport(), Config{Timeout: 2 * time.Second}, breaker.Config{})
				srv.FailNext("in.php", 3, tc.fault)

				_, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
				require.ErrorIs(t, err, ErrAmbiguous)
				after, ok := FailFast(err)
				require.True(t, ok)
				require.GreaterOrEqual(t, after, time.Second)
				require.EqualValues(t, 1, srv.SubmitRequests())
				require.Equal(t, tc.created, srv.Submits())
				require.EqualValues(t, 1, c.Stats.Ambiguous.Load())
				require.Zero(t, c.Stats.Retries.Load())
			})
		})
	}

	t.Run("connection refused before anything was written is retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			srv.SetOutage(true)
			c.Observe = func(a Attempt) {
				if a.N == 1 {
					require.Equal(t, "dial", a.Class)
					srv.SetOutage(false)
				}
			}
			a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, captchaai.StatusOK, a.Status)
			require.EqualValues(t, 2, srv.Requests())
			require.EqualValues(t, 1, srv.Submits())
		})
	})

	t.Run("dial error from the default transport is retried", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		dead := "http://" + ln.Addr().String()
		require.NoError(t, ln.Close())

		c := newClient(t, nil, Config{BaseURL: dead, BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}, breaker.Config{})
		_, err = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
		var de *DialError
		require.ErrorAs(t, err, &de)
		require.ErrorIs(t, err, ErrUnavailable)
		require.EqualValues(t, 3, c.Stats.Attempts.Load())
	})

	t.Run("HTTP 429 is retried after Retry-After", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			rt := scripted(srv.Transport(), respond(429, "text/html", "<h1>Too Many Requests</h1>", "Retry-After", "2"))
			c := newClient(t, rt, Config{}, breaker.Config{})
			start := time.Now()
			a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, captchaai.StatusOK, a.Status)
			require.GreaterOrEqual(t, time.Since(start), 2*time.Second)
			require.EqualValues(t, 1, srv.SubmitRequests())
		})
	})

	t.Run("a Retry-After longer than backoff_cap is not waited for", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			rt := scripted(srv.Transport(), respond(429, "text/plain", "slow down", "Retry-After", "600"))
			c := newClient(t, rt, Config{}, breaker.Config{})
			_, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.ErrorIs(t, err, ErrUnavailable)
			require.Zero(t, srv.Requests())
		})
	})

	t.Run("a 4xx page from the front is passed through", func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		rt := scripted(srv.Transport(), respond(403, "text/html", "<h1>Forbidden</h1>"))
		c := newClient(t, rt, Config{}, breaker.Config{})
		a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
		require.NoError(t, err)
		require.Equal(t, captchaai.StatusRaw, a.Status)
		require.Equal(t, 403, a.HTTPStatus)
		require.Equal(t, "<h1>Forbidden</h1>", string(a.Raw))
		require.Equal(t, "text/html", a.ContentType)
	})

	t.Run("GET in.php is not replayed by net/http on a dropped keep-alive connection", func(t *testing.T) {
		var calls atomic.Int64
		var submitHeaders atomic.Pointer[string]
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/in.php" {
				h := fmt.Sprintf("%s len=%d te=%v", r.Method, r.ContentLength, r.TransferEncoding)
				submitHeaders.Store(&h)
			}
			if calls.Add(1) == 2 { // read the request, then drop the connection
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					_ = conn.Close()
				}
				return
			}
			_, _ = io.WriteString(w, "OK|12345678901")
		}))
		defer ts.Close()
		tr := NewTransport(0)
		defer tr.CloseIdleConnections()
		c := newClient(t, tr, Config{BaseURL: ts.URL}, breaker.Config{})

		_, err := c.Result(context.Background(), pollReq(goodKey, "12345678901", captchaai.FormatText))
		require.NoError(t, err) // primes a keep-alive connection
		q := url.Values{"key": {goodKey}, "method": {"turnstile"}, "sitekey": {"0x4AAA"}, "pageurl": {"https://example.com/"}}
		_, err = c.Submit(context.Background(), getReq("/in.php", q))
		require.ErrorIs(t, err, ErrAmbiguous)
		require.EqualValues(t, 2, calls.Load(), "the submission reached the server exactly once")
		require.Equal(t, "GET len=0 te=[]", *submitHeaders.Load(), "still a plain GET without a body")
	})
}

func TestSubmitHeaders(t *testing.T) {
	t.Run("idempotency headers are dropped so net/http never resends a submission", func(t *testing.T) {
		var got http.Header
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			got = r.Header.Clone()
			return respond(200, "text/plain", "OK|12345678901")(r)
		})
		c := newClient(t, rt, Config{}, breaker.Config{})
		r := submitReq(goodKey, captchaai.FormatText)
		r.Header.Set("X-Idempotency-Key", "abc")
		r.Header.Set("X-Custom", "kept")
		_, err := c.Submit(context.Background(), r)
		require.NoError(t, err)
		require.Empty(t, got.Get("X-Idempotency-Key"))
		require.Equal(t, "kept", got.Get("X-Custom"))
	})

	t.Run("GET submissions are not rewindable", func(t *testing.T) {
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			require.Nil(t, r.GetBody)
			require.NotNil(t, r.Body)
			require.NotEqual(t, http.NoBody, r.Body)
			return respond(200, "text/plain", "OK|12345678901")(r)
		})
		c := newClient(t, rt, Config{}, breaker.Config{})
		q := url.Values{"key": {goodKey}, "method": {"turnstile"}, "sitekey": {"0x4AAA"}, "pageurl": {"https://example.com/"}}
		_, err := c.Submit(context.Background(), getReq("/in.php", q))
		require.NoError(t, err)
	})

	t.Run("POST bodies stay rewindable for polls", func(t *testing.T) {
		rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			require.NotNil(t, r.GetBody)
			return respond(200, "text/plain", "CAPCHA_NOT_READY")(r)
		})
		c := newClient(t, rt, Config{}, breaker.Config{})
		r := captchaai.Parse(http.MethodPost, "/res.php", "", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
			[]byte("key="+goodKey+"&action=get&id=12345678901"))
		a, err := c.Result(context.Background(), r)
		require.NoError(t, err)
		require.Equal(t, captchaai.StatusNotReady, a.Status)
	})
}

func TestPermanentCodes(t *testing.T) {
	codes := []string{
		"ERROR_WRONG_USER_KEY", "ERROR_KEY_DOES_NOT_EXIST", "ERROR_IP_NOT_ALLOWED", "IP_BANNED",
		"ERROR_PAGEURL", "ERROR_GOOGLEKEY", "ERROR_BAD_PARAMETERS", "ERROR_ZERO_CAPTCHA_FILESIZE",
		"ERROR_WRONG_FILE_EXTENSION", "ERROR_BAD_PROXY", "ERROR_NO_SUCH_METHOD", "ERROR_CAPTCHA_UNSOLVABLE",
		"ERROR_WRONG_CAPTCHA_ID", "ERROR_WRONG_ID_FORMAT", "ERROR_TOKEN_EXPIRED", "MAX_USER_TURN", "ERROR: 1001",
		"ERROR_SOMETHING_NEW",
	}
	srv := captchaaitest.NewInProcess(t)
	c := newClient(t, srv.Transport(), Config{}, breaker.Config{ConsecutiveFailures: 2, MinRequests: 2})
	for i, code := range codes {
		for _, ep := range []string{"in.php", "res.php"} {
			t.Run(ep+" "+code, func(t *testing.T) {
				key := keyN(2*i + len(ep)%2) // fresh key: account and throttle answers are remembered
				before := srv.Requests()
				srv.FailCode(ep, 1, code)
				var a captchaai.Answer
				var err error
				if ep == "in.php" {
					a, err = c.Submit(context.Background(), submitReq(key, captchaai.FormatText))
				} else {
					a, err = c.Result(context.Background(), pollReq(key, "12345678901", captchaai.FormatText))
				}
				require.NoError(t, err)
				require.Equal(t, code, a.Value)
				require.Equal(t, before+1, srv.Requests(), "never retried")
				require.Equal(t, breaker.Closed, c.Circuit().State(), "never trips the circuit")
			})
		}
	}
	require.Zero(t, c.Stats.Retries.Load())
	require.Zero(t, c.Stats.Failures.Load())
}

func TestResultRetry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault captchaaitest.Fault
	}{
		{"HTML 502 burst is retried", captchaaitest.FaultHTML502},
		{"HTML 500 burst is retried", captchaaitest.FaultHTML500},
		{"ERROR_SERVER_ERROR is retried", captchaaitest.FaultServerError},
		{"NO_SLOT on a poll is retried", captchaaitest.FaultNoSlot},
		{"reset is retried", captchaaitest.FaultReset},
		{"timeout is retried", captchaaitest.FaultTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := captchaaitest.NewInProcess(t, captchaaitest.SolveAfterPolls(0))
				c := newClient(t, srv.Transport(), Config{Timeout: time.Second}, breaker.Config{})
				id := submitOK(t, c, goodKey)
				srv.FailNext("res.php", 2, tc.fault)

				a, err := c.Result(context.Background(), pollReq(goodKey, id, captchaai.FormatText))
				require.NoError(t, err)
				require.Equal(t, captchaai.StatusOK, a.Status)
				require.True(t, strings.HasPrefix(a.Value, "TOKEN-"+id))
				require.EqualValues(t, 3, srv.Polls())
				require.EqualValues(t, 2, c.Stats.Retries.Load())
			})
		})
	}

	t.Run("exhausted transient failures fail fast", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			id := submitOK(t, c, goodKey)
			srv.FailNext("res.php", 10, captchaaitest.FaultServerError)
			_, err := c.Result(context.Background(), pollReq(goodKey, id, captchaai.FormatText))
			require.ErrorIs(t, err, ErrUnavailable)
			var ce *codeError
			require.ErrorAs(t, err, &ce)
			_, ok := FailFast(err)
			require.True(t, ok, "the proxy answers CAPCHA_NOT_READY")
			require.EqualValues(t, 3, srv.Polls())
		})
	})

	t.Run("getbalance is retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			srv.FailNext("res.php", 1, captchaaitest.FaultHTML502)
			a, err := c.Result(context.Background(), balanceReq(goodKey))
			require.NoError(t, err)
			require.Equal(t, captchaaitest.DefaultBalance, a.Value)
			require.True(t, a.Bare)
			require.EqualValues(t, 2, srv.Requests())
		})
	})

	t.Run("backoff never runs past the caller's deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{MaxAttempts: 10, BackoffBase: time.Second, BackoffCap: 10 * time.Second},
				breaker.Config{ConsecutiveFailures: 100, FailureRatio: 2})
			c.rnd = func(n int64) int64 { return n - 1 } // the longest waits full jitter can draw
			srv.FailNext("res.php", 100, captchaaitest.FaultHTML502)

			ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := c.Result(ctx, pollReq(goodKey, "12345678901", captchaai.FormatText))
			require.ErrorIs(t, err, ErrUnavailable)
			require.Less(t, time.Since(start), 2500*time.Millisecond, "gave up instead of sleeping past the deadline")
			require.NoError(t, ctx.Err())
			// Attempt 1 at 0s, retry after ~1s; the next wait (~2s) would end past 2.5s.
			require.EqualValues(t, 2, srv.Requests())
		})
	})
}

func TestForward(t *testing.T) {
	t.Run("non-protocol 404 passes through as StatusRaw", func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{}, breaker.Config{ConsecutiveFailures: 1})
		r := captchaai.Parse(http.MethodPost, "/solve.php", "", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
			[]byte("key="+goodKey+"&method=post"))
		a, err := c.Forward(context.Background(), r)
		require.NoError(t, err)
		require.Equal(t, captchaai.StatusRaw, a.Status)
		require.Equal(t, http.StatusNotFound, a.HTTPStatus)
		require.Equal(t, "Not Found", string(a.Raw))
		require.Equal(t, "text/plain; charset=utf-8", a.ContentType)
		require.Equal(t, breaker.Closed, c.Circuit().State(), "an unknown action's reply is not a failure")
	})

	t.Run("HTML 404 page passes through untouched", func(t *testing.T) {
		page := "<html><body><h1>404</h1></body></html>"
		c := newClient(t, scripted(nil, respond(404, "text/html", page)), Config{}, breaker.Config{})
		a, err := c.Forward(context.Background(), getReq("/res.php", url.Values{"key": {goodKey}, "action": {"threadsinfo"}}))
		require.NoError(t, err)
		require.Equal(t, captchaai.StatusRaw, a.Status)
		require.Equal(t, page, string(a.Raw))
		require.Equal(t, page, string(a.Render(captchaai.FormatJSON)))
	})

	t.Run("report answers with an empty body", func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
		id := submitOK(t, c, goodKey)
		a, err := c.Forward(context.Background(), getReq("/res.php", url.Values{"key": {goodKey}, "action": {"reportbad"}, "id": {id}}))
		require.NoError(t, err)
		require.Equal(t, captchaai.StatusEmpty, a.Status)
		require.EqualValues(t, 1, srv.Reports())
	})

	t.Run("5xx is not retried and is no answer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			id := submitOK(t, c, goodKey)
			srv.FailNext("res.php", 3, captchaaitest.FaultHTML502)
			_, err := c.Forward(context.Background(), getReq("/res.php", url.Values{"key": {goodKey}, "action": {"reportgood"}, "id": {id}}))
			require.ErrorIs(t, err, ErrUnavailable)
			_, ok := FailFast(err)
			require.True(t, ok)
			require.EqualValues(t, 1, srv.Reports())
		})
	})

	t.Run("dial error is retried", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			rt := scripted(srv.Transport(), fail(&DialError{Err: errors.New("connect: connection refused")}))
			c := newClient(t, rt, Config{}, breaker.Config{})
			a, err := c.Forward(context.Background(), balanceReq(goodKey))
			require.NoError(t, err)
			require.Equal(t, captchaaitest.DefaultBalance, a.Value)
			require.EqualValues(t, 1, c.Stats.Retries.Load())
		})
	})
}

func TestFormatPreserved(t *testing.T) {
	srv := captchaaitest.NewInProcess(t, captchaaitest.NumericJSONIDs("userrecaptcha"), captchaaitest.SolveAfterPolls(0))
	c := newClient(t, srv.Transport(), Config{}, breaker.Config{})

	a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatJSON))
	require.NoError(t, err)
	require.Equal(t, captchaai.FormatJSON, a.Format)
	require.Equal(t, `{"status":1,"request":`+a.Value+`}`, string(a.Raw), "numeric ID stays numeric")
	require.Equal(t, a.Raw, a.Render(captchaai.FormatJSON))
	require.Equal(t, "application/json", a.ContentType)
	require.Equal(t, http.StatusOK, a.HTTPStatus)

	p, err := c.Result(context.Background(), pollReq(goodKey, a.Value, captchaai.FormatJSON))
	require.NoError(t, err)
	require.Equal(t, captchaai.FormatJSON, p.Format)
	require.Equal(t, `{"status":1,"request":"`+p.Value+`"}`, string(p.Raw))

	p, err = c.Result(context.Background(), pollReq(goodKey, a.Value, captchaai.FormatText))
	require.NoError(t, err)
	require.Equal(t, "OK|"+p.Value, string(p.Raw))
	require.Equal(t, "text/plain; charset=utf-8", p.ContentType)
}

func TestBreaker(t *testing.T) {
	t.Run("full outage: opens, stops calling, probes, recovers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const clients = 50
			bc := breaker.Config{ConsecutiveFailures: 5, MinRequests: 10, FailureRatio: 0.5,
				Window: 10 * time.Second, OpenFor: 5 * time.Second, Probes: 1}
			srv := captchaaitest.NewInProcess(t, captchaaitest.SolveAfterPolls(1_000_000))
			c := newClient(t, srv.Transport(), Config{}, bc)
			var changes []string
			var chMu sync.Mutex
			c.circuit.OnChange(func(from, to breaker.State) {
				c.circuitChanged(from, to)
				chMu.Lock()
				changes = append(changes, from.String()+"→"+to.String())
				chMu.Unlock()
			})
			ids := make([]string, clients)
			for i := range ids {
				ids[i] = submitOK(t, c, goodKey)
			}

			srv.SetOutage(true)
			before := srv.Requests()
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var answered, refused atomic.Int64
			for i := range clients {
				wg.Go(func() {
					for n := 0; ctx.Err() == nil; n++ {
						var err error
						if n%5 == 0 {
							_, err = c.Submit(ctx, submitReq(goodKey, captchaai.FormatText))
						} else {
							_, err = c.Result(ctx, pollReq(goodKey, ids[i], captchaai.FormatText))
						}
						if err == nil {
							answered.Add(1)
						} else if _, ok := FailFast(err); ok {
							refused.Add(1)
						}
						_ = sleep(ctx, time.Second)
					}
				})
			}

			time.Sleep(2500 * time.Millisecond)
			require.Equal(t, breaker.Open, c.Circuit().State())
			opened := srv.Requests()
			t.Logf("%d upstream calls before the circuit opened", opened-before)
			require.LessOrEqual(t, opened-before, int64(bc.ConsecutiveFailures)+clients,
				"opens within its threshold (plus calls already admitted)")
			require.Positive(t, refused.Load())

			time.Sleep(2 * time.Second) // t = 4.5s, still open
			require.Equal(t, opened, srv.Requests(), "no upstream calls while open")

			time.Sleep(2 * time.Second) // t = 6.5s: one half-open probe went out and failed
			require.Equal(t, opened+1, srv.Requests(), "exactly one probe")
			require.Equal(t, breaker.Open, c.Circuit().State())

			srv.SetOutage(false) // the outage ends; the next probe succeeds
			time.Sleep(7 * time.Second)
			require.Equal(t, breaker.Closed, c.Circuit().State())
			recovered := srv.Requests()
			answeredBefore := answered.Load()
			time.Sleep(3 * time.Second)
			require.Greater(t, srv.Requests()-recovered, int64(2*clients), "traffic flows again")
			require.Greater(t, answered.Load()-answeredBefore, int64(2*clients))

			stop()
			wg.Wait()
			chMu.Lock()
			require.Equal(t, []string{"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed"}, changes)
			chMu.Unlock()
			require.EqualValues(t, 2, c.Stats.BreakerOpens.Load())
			require.Positive(t, c.Stats.BreakerRejects.Load())
		})
	})

	t.Run("caller cancellations do not trip it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(time.Minute))
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{ConsecutiveFailures: 2, MinRequests: 2})
			for i := range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if i%2 == 1 {
					go func() { time.Sleep(500 * time.Millisecond); cancel() }()
				}
				_, err := c.Result(ctx, pollReq(goodKey, "12345678901", captchaai.FormatText))
				require.Error(t, err)
				cancel()
			}
			require.Equal(t, breaker.Closed, c.Circuit().State())
			require.Zero(t, c.Stats.Failures.Load())
		})
	})

	t.Run("own timeouts do trip it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(time.Minute))
			c := newClient(t, srv.Transport(), Config{Timeout: time.Second, MaxAttempts: 1}, breaker.Config{ConsecutiveFailures: 2})
			for range 2 {
				_, err := c.Result(context.Background(), pollReq(goodKey, "12345678901", captchaai.FormatText))
				require.ErrorIs(t, err, ErrUnavailable)
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
			require.Equal(t, breaker.Open, c.Circuit().State())
			_, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.ErrorIs(t, err, breaker.ErrOpen)
			_, ok := FailFast(err)
			require.True(t, ok)
		})
	})
}

func TestRateLimit(t *testing.T) {
	t.Run("upstream never sees more than limit plus burst in any second", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const limit, burst = 10, 5
			srv := captchaaitest.NewInProcess(t)
			rec := &recorder{next: srv.Transport()}
			c := newClient(t, rec, Config{Rate: limit, Burst: burst}, breaker.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for range 100 {
				wg.Go(func() {
					for ctx.Err() == nil {
						_, err := c.Result(ctx, balanceReq(goodKey))
						if after, ok := FailFast(err); ok {
							_ = sleep(ctx, after)
						}
					}
				})
			}
			wg.Wait()
			require.LessOrEqual(t, rec.maxPerWindow(time.Second), limit+burst)
			require.GreaterOrEqual(t, len(rec.times), burst+limit*4, "the limit is used, not starved")
			require.Positive(t, c.Stats.RateLimitWaits.Load())
			require.Positive(t, c.Stats.RateLimitRejects.Load())
		})
	})

	t.Run("per-key limit", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			rec := &recorder{next: srv.Transport()}
			c := newClient(t, rec, Config{KeyRate: 2, KeyBurst: 1}, breaker.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var perKey [2]atomic.Int64
			for i := range 20 {
				wg.Go(func() {
					for ctx.Err() == nil {
						_, err := c.Result(ctx, balanceReq(keyN(i%2)))
						if err == nil {
							perKey[i%2].Add(1)
						} else if after, ok := FailFast(err); ok {
							_ = sleep(ctx, after)
						}
					}
				})
			}
			wg.Wait()
			for k := range perKey {
				require.InDelta(t, 6, perKey[k].Load(), 1, "key %d: 1 + 2/s over 3 s", k)
			}
		})
	})

	t.Run("in-flight cap", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(100*time.Millisecond))
			rec := &recorder{next: srv.Transport()}
			c := newClient(t, rec, Config{MaxInFlight: 3}, breaker.Config{})
			var wg sync.WaitGroup
			for range 30 {
				wg.Go(func() {
					_, err := c.Result(context.Background(), balanceReq(goodKey))
					require.NoError(t, err)
				})
			}
			wg.Wait()
			require.Equal(t, 3, rec.maxInFlight)
			require.Len(t, rec.times, 30)
		})
	})

	t.Run("a wait longer than max_wait fails fast", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(time.Second))
			c := newClient(t, srv.Transport(), Config{MaxInFlight: 1, MaxWait: 100 * time.Millisecond}, breaker.Config{})
			_ = submitOK(t, c, goodKey) // the key is vetted
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Go(func() { _, errs[i] = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText)) })
			}
			wg.Wait()
			require.Len(t, slicesNonNil(errs), 1)
			err := slicesNonNil(errs)[0]
			require.ErrorIs(t, err, ErrRateLimited)
			_, ok := FailFast(err)
			require.True(t, ok)
			require.EqualValues(t, 1, c.Stats.RateLimitRejects.Load())
		})
	})

	t.Run("a deadline reached while waiting fails fast", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(time.Second))
			c := newClient(t, srv.Transport(), Config{MaxInFlight: 1}, breaker.Config{})
			_ = submitOK(t, c, goodKey)
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText)) })
			synctest.Wait() // the slot is taken
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.Result(ctx, balanceReq(goodKey))
			require.ErrorIs(t, err, ErrRateLimited)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			_, ok := FailFast(err)
			require.True(t, ok)
			wg.Wait()
		})
	})

	t.Run("a token due after the deadline is not waited for", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{Rate: 1, Burst: 1, MaxWait: time.Minute}, breaker.Config{})
			_, err := c.Result(context.Background(), balanceReq(goodKey))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err = c.Result(ctx, balanceReq(goodKey))
			require.ErrorIs(t, err, ErrRateLimited)
			require.Zero(t, time.Since(start), "refused at once")
		})
	})
}

func slicesNonNil(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

func TestBadKey(t *testing.T) {
	t.Run("100 submissions with a bad key make 1 upstream call within bad_key_ttl", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(50*time.Millisecond))
			c := newClient(t, srv.Transport(), Config{BadKeyTTL: time.Minute}, breaker.Config{})
			const bad = "not-a-valid-key"
			_, err := c.Result(context.Background(), balanceReq(goodKey)) // learn CaptchaAI's Content-Type for JSON
			require.NoError(t, err)
			_, err = c.Result(context.Background(), pollReq(goodKey, "12345678901", captchaai.FormatJSON))
			require.NoError(t, err)
			calls := srv.Requests()
			var wg sync.WaitGroup
			for i := range 100 {
				wg.Go(func() {
					f := captchaai.Format(i % 2)
					a, err := c.Submit(context.Background(), submitReq(bad, f))
					require.NoError(t, err)
					require.Equal(t, "ERROR_WRONG_USER_KEY", a.Value)
					require.Equal(t, f, a.Format)
					want := "ERROR_WRONG_USER_KEY"
					if f == captchaai.FormatJSON {
						want = `{"status":0,"request":"ERROR_WRONG_USER_KEY"}`
					}
					require.Equal(t, want, string(a.Raw), "rendered in the client's own format")
				})
			}
			wg.Wait()
			require.Equal(t, calls+1, srv.Requests())
			require.EqualValues(t, 99, c.Stats.BadKeyLocal.Load())

			// Polls and balance checks of the key are answered locally too.
			a, err := c.Result(context.Background(), pollReq(bad, "12345678901", captchaai.FormatJSON))
			require.NoError(t, err)
			require.Equal(t, "ERROR_WRONG_USER_KEY", a.Value)
			require.Equal(t, "application/json", a.ContentType, "Content-Type CaptchaAI used for JSON")

			time.Sleep(59 * time.Second)
			_, err = c.Submit(context.Background(), submitReq(bad, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, calls+1, srv.Requests(), "still remembered")

			time.Sleep(2 * time.Second)
			_, err = c.Submit(context.Background(), submitReq(bad, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, calls+2, srv.Requests(), "asked again after bad_key_ttl")

			// Other keys were never held up.
			_ = submitOK(t, c, goodKey)
		})
	})

	t.Run("a good key flows freely once vetted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t, captchaaitest.Latency(time.Second))
			rec := &recorder{next: srv.Transport()}
			c := newClient(t, rec, Config{}, breaker.Config{})
			var wg sync.WaitGroup
			start := time.Now()
			for range 10 {
				wg.Go(func() {
					_ = submitOK(t, c, goodKey)
				})
			}
			wg.Wait()
			require.Equal(t, 2*time.Second, time.Since(start), "one vetting call, then the rest at once")
			require.Equal(t, 9, rec.maxInFlight)
			require.EqualValues(t, 10, srv.Submits())
		})
	})

	t.Run("a failed vetting call lets the next one try", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
			srv.FailNext("in.php", 1, captchaaitest.FaultHTML500)
			_, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.ErrorIs(t, err, ErrAmbiguous)
			_ = submitOK(t, c, goodKey)
		})
	})

	t.Run("IP_BANNED is remembered for the announced ban", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := captchaaitest.NewInProcess(t)
			c := newClient(t, srv.Transport(), Config{BadKeyTTL: time.Minute}, breaker.Config{})
			srv.FailCode("in.php", 1, "IP_BANNED")
			a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, "IP_BANNED", a.Value)
			time.Sleep(4 * time.Minute)
			a, err = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
			require.NoError(t, err)
			require.Equal(t, "IP_BANNED", a.Value)
			require.EqualValues(t, 1, srv.Requests())
			time.Sleep(time.Minute + time.Second)
			_ = submitOK(t, c, goodKey)
			require.EqualValues(t, 2, srv.Requests())
		})
	})
}

func TestUnparsedRequestsAreNotRemembered(t *testing.T) {
	srv := captchaaitest.NewInProcess(t)
	c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
	// A multipart body without its closing boundary: the key inside it is
	// not found, so the request must not be judged (or vetted) as keyless.
	body := "--b\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n" + goodKey + "\r\n"
	for range 3 {
		r := captchaai.Parse(http.MethodPost, "/in.php", "", http.Header{"Content-Type": {"multipart/form-data; boundary=b"}}, []byte(body))
		require.False(t, r.Understood)
		_, err := c.Submit(context.Background(), r)
		require.NoError(t, err)
	}
	require.EqualValues(t, 3, srv.Requests())
	require.Zero(t, c.Stats.BadKeyLocal.Load())
}

func TestPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
		paused, other := keyN(1), keyN(2)
		srv.FailCode("in.php", 1, "MAX_USER_TURN")

		a, err := c.Submit(context.Background(), submitReq(paused, captchaai.FormatText))
		require.NoError(t, err)
		require.Equal(t, "MAX_USER_TURN", a.Value, "the real throttle answer is passed on")
		calls := srv.Requests()

		time.Sleep(4 * time.Second)
		_, err = c.Submit(context.Background(), submitReq(paused, captchaai.FormatText))
		require.ErrorIs(t, err, ErrPaused)
		after, ok := FailFast(err)
		require.True(t, ok)
		require.Equal(t, 6*time.Second, after, "the rest of the announced 10 s")
		var ra interface{ RetryAfter() time.Duration }
		require.ErrorAs(t, err, &ra)
		require.Equal(t, after, ra.RetryAfter())
		_, err = c.Result(context.Background(), pollReq(paused, "12345678901", captchaai.FormatText))
		require.ErrorIs(t, err, ErrPaused)
		require.Equal(t, calls, srv.Requests(), "nothing sent while paused")

		_ = submitOK(t, c, other) // other keys are not paused

		time.Sleep(6 * time.Second)
		_ = submitOK(t, c, paused)
		require.EqualValues(t, 2, c.Stats.Paused.Load())
		require.EqualValues(t, 1, c.Stats.Pauses.Load())
	})
}

func TestRetryBudget(t *testing.T) {
	t.Run("at 50% transient failures upstream calls per request stay at or under 1.2", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const clients, rounds = 50, 20
			srv := captchaaitest.NewInProcess(t, captchaaitest.SolveAfterPolls(1_000_000), captchaaitest.Seed(7))
			// The circuit is kept out of the way to measure the budget alone.
			c := newClient(t, srv.Transport(), Config{}, breaker.Config{FailureRatio: 2, ConsecutiveFailures: 1 << 30})
			ids := make([]string, clients)
			for i := range ids {
				ids[i] = submitOK(t, c, goodKey)
			}
			time.Sleep(budgetWindow) // the set-up calls no longer fund retries
			srv.FailRatio("in.php", 0.5, captchaaitest.FaultNoSlot)
			srv.FailRatio("res.php", 0.5, captchaaitest.FaultHTML502)
			calls0, reqs0 := srv.Requests(), c.Stats.Requests.Load()
			start := time.Now()

			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() {
					for n := range rounds {
						if n%4 == 0 {
							_, _ = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
						} else {
							_, _ = c.Result(context.Background(), pollReq(goodKey, ids[i], captchaai.FormatText))
						}
						time.Sleep(100 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			calls, reqs := srv.Requests()-calls0, c.Stats.Requests.Load()-reqs0
			ratio := float64(calls) / float64(reqs)
			t.Logf("%d upstream calls for %d requests in %v: %.3f; retries %d, denied %d",
				calls, reqs, time.Since(start), ratio, c.Stats.Retries.Load(), c.Stats.RetriesDenied.Load())
			require.LessOrEqual(t, ratio, 1.2)
			require.Positive(t, c.Stats.Retries.Load())
			require.Positive(t, c.Stats.RetriesDenied.Load())
		})
	})
}

// TestNoLeaks drives every path that starts or abandons work (waits,
// refusals, cancellations, hung attempts) inside a bubble: synctest.Test
// fails if any goroutine is left behind.
func TestNoLeaks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{Rate: 5, MaxInFlight: 2, MaxWait: time.Second, Timeout: time.Second},
			breaker.Config{ConsecutiveFailures: 3, OpenFor: time.Second})
		srv.FailRatio("in.php", 0.3, captchaaitest.FaultTimeout)
		srv.FailRatio("res.php", 0.3, captchaaitest.FaultReset)
		var wg sync.WaitGroup
		for i := range 30 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*300*time.Millisecond)
				defer cancel()
				_, _ = c.Submit(ctx, submitReq(keyN(i%3), captchaai.FormatText))
				_, _ = c.Result(ctx, pollReq(keyN(i%3), "12345678901", captchaai.FormatText))
				_, _ = c.Forward(ctx, balanceReq("bad"))
			})
		}
		wg.Wait()
		synctest.Wait()
	})
}

func TestObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{}, breaker.Config{})
		var got []Attempt
		c.Observe = func(a Attempt) { got = append(got, a) }
		srv.FailNext("in.php", 1, captchaaitest.FaultNoSlot)
		_ = submitOK(t, c, goodKey)
		require.Len(t, got, 2)
		require.Equal(t, Attempt{Kind: captchaai.KindSubmit, N: 1, HTTPStatus: 200, Code: captchaai.CodeNoSlot, Class: "capacity"}, got[0])
		require.Equal(t, Attempt{Kind: captchaai.KindSubmit, N: 2, HTTPStatus: 200, Class: "ok"}, got[1])
	})
}

func TestLogsNeverCarryTheKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		srv := captchaaitest.NewInProcess(t)
		c := newClient(t, srv.Transport(), Config{}, breaker.Config{ConsecutiveFailures: 1})
		c.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		srv.FailCode("in.php", 1, "MAX_USER_TURN")
		_, _ = c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
		_, _ = c.Submit(context.Background(), submitReq("wrong", captchaai.FormatText))
		srv.FailNext("res.php", 1, captchaaitest.FaultHTML502)
		_, _ = c.Result(context.Background(), pollReq(keyN(5), "12345678901", captchaai.FormatText))
		out := buf.String()
		require.Contains(t, out, "upstream throttled API key")
		require.Contains(t, out, "upstream rejected API key")
		require.Contains(t, out, "upstream attempt failed")
		require.Contains(t, out, "to=open")
		require.Contains(t, out, captchaai.AccountOf(goodKey))
		require.NotContains(t, out, goodKey)
		require.NotContains(t, out, "wrong ")
		require.NotContains(t, out, keyN(5))
	})
}

func BenchmarkResultRoundTrip(b *testing.B) {
	srv := captchaaitest.NewServer(b, captchaaitest.SolveAfterPolls(0))
	c := newClient(b, nil, Config{BaseURL: srv.URL}, breaker.Config{})
	a, err := c.Submit(context.Background(), submitReq(goodKey, captchaai.FormatText))
	require.NoError(b, err)
	r := pollReq(goodKey, a.Value, captchaai.FormatText)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Result(context.Background(), r); err != nil {
			b.Fatal(err)
		}
	}
}
