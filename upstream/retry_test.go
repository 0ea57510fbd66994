package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/stretchr/testify/require"
)

func answer(t *testing.T, body string) captchaai.Answer {
	t.Helper()
	a, err := captchaai.ParseAnswer([]byte(body))
	if errors.Is(err, captchaai.ErrNotProtocol) {
		return captchaai.Answer{Status: captchaai.StatusRaw, Raw: []byte(body)}
	}
	require.NoError(t, err)
	return a
}

func TestClassify(t *testing.T) {
	var (
		dialErr    = &DialError{Err: errors.New("connect: connection refused")}
		opDial     = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		refused    = fmt.Errorf("wrapped: %w", syscall.ECONNREFUSED)
		reset      = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		timeout    = fmt.Errorf("round trip: %w", context.DeadlineExceeded)
		canceled   = fmt.Errorf("round trip: %w", context.Canceled)
		html       = "<html><body>502 Bad Gateway</body></html>"
		submit     = captchaai.KindSubmit
		result     = captchaai.KindResult
		multi      = captchaai.KindMultiResult
		balance    = captchaai.KindBalance
		report     = captchaai.KindReport
		other      = captchaai.KindOther
		allKinds   = []captchaai.Kind{submit, result, multi, balance, report, other}
		idempotent = []captchaai.Kind{result, multi, balance}
	)
	type want struct {
		retry, ambiguous, failure, raw bool
		label                          string
	}
	cases := []struct {
		name   string
		kinds  []captchaai.Kind
		status int
		body   string
		err    error
		want   want
	}{
		// Nothing reached CaptchaAI: every kind retries.
		{"dial error", allKinds, 0, "", dialErr, want{retry: true, failure: true, label: "dial"}},
		{"dial op error", allKinds, 0, "", opDial, want{retry: true, failure: true, label: "dial"}},
		{"connection refused", allKinds, 0, "", refused, want{retry: true, failure: true, label: "dial"}},

		// Sent, then no answer.
		{"reset after send: in.php ambiguous", []captchaai.Kind{submit}, 0, "", reset, want{ambiguous: true, failure: true, label: "transport"}},
		{"reset after send: res.php retried", idempotent, 0, "", reset, want{retry: true, failure: true, label: "transport"}},
		{"reset after send: other fails", []captchaai.Kind{report, other}, 0, "", reset, want{failure: true, label: "transport"}},
		{"timeout: in.php ambiguous", []captchaai.Kind{submit}, 0, "", timeout, want{ambiguous: true, failure: true, label: "timeout"}},
		{"timeout: res.php retried", idempotent, 0, "", timeout, want{retry: true, failure: true, label: "timeout"}},
		{"canceled: in.php ambiguous", []captchaai.Kind{submit}, 0, "", canceled, want{ambiguous: true, failure: true, label: "canceled"}},

		// HTTP-level failures.
		{"429: in.php retried", []captchaai.Kind{submit}, 429, "Too Many Requests", nil, want{retry: true, label: "http_429"}},
		{"429: res.php retried", idempotent, 429, "Too Many Requests", nil, want{retry: true, label: "http_429"}},
		{"429: other not retried", []captchaai.Kind{report, other}, 429, "Too Many Requests", nil, want{label: "http_429"}},
		{"HTML 500: in.php ambiguous", []captchaai.Kind{submit}, 500, html, nil, want{ambiguous: true, failure: true, label: "http_5xx"}},
		{"HTML 502: in.php ambiguous", []captchaai.Kind{submit}, 502, html, nil, want{ambiguous: true, failure: true, label: "http_5xx"}},
		{"HTML 502: res.php retried", idempotent, 502, html, nil, want{retry: true, failure: true, label: "http_5xx"}},
		{"HTML 503: other fails", []captchaai.Kind{report, other}, 503, html, nil, want{failure: true, label: "http_5xx"}},
		{"5xx with a protocol body is still 5xx", []captchaai.Kind{submit}, 500, "ERROR_SERVER_ERROR", nil, want{ambiguous: true, failure: true, label: "http_5xx"}},
		{"HTML 200: in.php ambiguous", []captchaai.Kind{submit}, 200, html, nil, want{ambiguous: true, failure: true, label: "not_protocol"}},
		{"HTML 200: res.php retried", idempotent, 200, html, nil, want{retry: true, failure: true, label: "not_protocol"}},
		{"HTML 200: other passed through", []captchaai.Kind{report, other}, 200, html, nil, want{raw: true, label: "not_protocol"}},
		{"HTML 404: in.php passed through", []captchaai.Kind{submit}, 404, html, nil, want{raw: true, failure: true, label: "not_protocol"}},
		{"HTML 404: res.php retried", idempotent, 404, html, nil, want{retry: true, failure: true, label: "not_protocol"}},
		{"HTML 404: other passed through", []captchaai.Kind{report, other}, 404, html, nil, want{raw: true, label: "not_protocol"}},

		// Protocol answers.
		{"OK", allKinds, 200, "OK|12345678901", nil, want{label: "ok"}},
		{"not ready", allKinds, 200, "CAPCHA_NOT_READY", nil, want{label: "not_ready"}},
		{"empty report answer", allKinds, 200, "", nil, want{label: "empty"}},
		{"JSON OK", allKinds, 200, `{"status":1,"request":"12345678901"}`, nil, want{label: "ok"}},
		{"NO_SLOT: retried except other", []captchaai.Kind{submit, result, multi, balance}, 200, "ERROR_NO_SLOT_AVAILABLE", nil, want{retry: true, label: "capacity"}},
		{"NO_SLOT JSON: retried", []captchaai.Kind{submit}, 200, `{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE"}`, nil, want{retry: true, label: "capacity"}},
		{"ZERO_BALANCE (no free threads): retried", []captchaai.Kind{submit}, 200, "ERROR_ZERO_BALANCE", nil, want{retry: true, label: "capacity"}},
		{"NO_SLOT: other returned", []captchaai.Kind{report, other}, 200, "ERROR_NO_SLOT_AVAILABLE", nil, want{label: "capacity"}},
		{"SERVER_ERROR: in.php ambiguous", []captchaai.Kind{submit}, 200, "ERROR_SERVER_ERROR", nil, want{ambiguous: true, failure: true, label: "server"}},
		{"INTERNAL_SERVER_ERROR: res.php retried", idempotent, 200, "ERROR_INTERNAL_SERVER_ERROR", nil, want{retry: true, failure: true, label: "server"}},
		{"SERVER_ERROR: other returned", []captchaai.Kind{report, other}, 200, "ERROR_SERVER_ERROR", nil, want{failure: true, label: "server"}},
		{"MAX_USER_TURN: never retried", allKinds, 200, "MAX_USER_TURN", nil, want{label: "throttle"}},
		{"ERROR: 1001: never retried", allKinds, 200, "ERROR: 1001", nil, want{label: "throttle"}},
		{"wrong key: never retried", allKinds, 200, "ERROR_WRONG_USER_KEY", nil, want{label: "account"}},
		{"IP_BANNED: never retried", allKinds, 200, "IP_BANNED", nil, want{label: "banned"}},
		{"403 with a protocol code is that code", allKinds, 403, "ERROR_IP_NOT_ALLOWED", nil, want{label: "account"}},
		{"bad parameters: never retried", allKinds, 200, "ERROR_BAD_PARAMETERS", nil, want{label: "request"}},
		{"unsolvable: never retried", allKinds, 200, "ERROR_CAPTCHA_UNSOLVABLE", nil, want{label: "terminal"}},
		{"unknown code: never retried", allKinds, 200, "ERROR_SOMETHING_NEW", nil, want{label: "unknown"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var a captchaai.Answer
			if tc.err == nil {
				a = answer(t, tc.body)
			}
			for _, k := range tc.kinds {
				v := classify(k, tc.status, a, tc.err)
				got := want{retry: v.Retry, ambiguous: v.Ambiguous, failure: v.Failure, raw: v.Raw, label: v.Label}
				require.Equal(t, tc.want, got, "kind %v", k)
			}
		})
	}
}

// TestClassifyPermanentCodes walks the whole code table: only capacity and
// server codes are ever retried, only server codes count as failures.
func TestClassifyPermanentCodes(t *testing.T) {
	for _, code := range captchaai.Codes() {
		class := captchaai.Classify(code)
		for _, k := range []captchaai.Kind{captchaai.KindSubmit, captchaai.KindResult, captchaai.KindReport} {
			v := classify(k, 200, captchaai.Text(code), nil)
			retryable := class == captchaai.ClassCapacity || class == captchaai.ClassServer && k == captchaai.KindResult
			if k == captchaai.KindReport {
				retryable = false
			}
			require.Equal(t, retryable, v.Retry, "%s on %v", code, k)
			require.Equal(t, class == captchaai.ClassServer, v.Failure, "%s on %v", code, k)
			require.Equal(t, class == captchaai.ClassServer && k == captchaai.KindSubmit, v.Ambiguous, "%s on %v", code, k)
		}
	}
}

func TestBackoff(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the largest value full jitter can draw
	base, ceiling := 500*time.Millisecond, 10*time.Second
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, 500*time.Millisecond - 1},
		{2, time.Second - 1},
		{3, 2*time.Second - 1},
		{5, 8*time.Second - 1},
		{6, ceiling - 1},
		{70, ceiling - 1}, // no overflow
	} {
		t.Run(fmt.Sprint("retry ", tc.n), func(t *testing.T) {
			require.Equal(t, tc.want, backoff(tc.n, base, ceiling, top))
			require.Zero(t, backoff(tc.n, base, ceiling, func(int64) int64 { return 0 }))
		})
	}
	t.Run("zero base", func(t *testing.T) {
		require.Zero(t, backoff(1, 0, ceiling, top))
	})
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
	}{
		{"", 0},
		{"7", 7 * time.Second},
		{"0", 0},
		{"soon", 0},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"99999999999999999999", 24 * time.Hour},
	} {
		t.Run(tc.v, func(t *testing.T) {
			require.Equal(t, tc.want, parseRetryAfter(http.Header{"Retry-After": {tc.v}}, now))
		})
	}
}

func TestBudget(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	t.Run("reserve lets a lone request retry", func(t *testing.T) {
		b := newBudget(0.2, 1) // floor: 10 retries per 10 s window
		b.deposit(t0)
		for i := 0; i < 10; i++ {
			require.True(t, b.withdraw(t0), "retry %d", i)
		}
		require.False(t, b.withdraw(t0))
		require.True(t, b.withdraw(t0.Add(budgetWindow)), "the window moved on")
	})
	t.Run("ratio bounds retries under load", func(t *testing.T) {
		b := newBudget(0.2, 1)
		allowed := 0
		for i := 0; i < 1000; i++ {
			now := t0.Add(time.Duration(i) * time.Millisecond)
			b.deposit(now)
			if b.withdraw(now) { // every call wants a retry
				allowed++
			}
		}
		require.LessOrEqual(t, allowed, 200)
		require.GreaterOrEqual(t, allowed, 190)
	})
	t.Run("negative reserve: ratio only", func(t *testing.T) {
		b := newBudget(0.2, -1)
		b.deposit(t0)
		require.False(t, b.withdraw(t0))
		for i := 0; i < 4; i++ {
			b.deposit(t0)
		}
		require.True(t, b.withdraw(t0))
		require.False(t, b.withdraw(t0))
	})
	t.Run("old calls stop funding retries", func(t *testing.T) {
		b := newBudget(0.2, -1)
		for i := 0; i < 100; i++ {
			b.deposit(t0)
		}
		require.True(t, b.withdraw(t0.Add(budgetWindow-bucketSpan)))
		require.False(t, b.withdraw(t0.Add(budgetWindow)))
	})
}

func TestFailFast(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		after time.Duration
		ok    bool
	}{
		{"nil", nil, 0, false},
		{"caller canceled", context.Canceled, 0, false},
		{"other error", errors.New("boom"), 0, false},
		{"breaker open", fmt.Errorf("x: %w", breaker.ErrOpen), defaultRetryAfter, true},
		{"rate limited", fmt.Errorf("x: %w", ErrRateLimited), defaultRetryAfter, true},
		{"paused, with its window", &refusal{kind: ErrPaused, after: 9 * time.Second}, 9 * time.Second, true},
		{"short waits round up to 1s", &refusal{kind: ErrRateLimited, after: time.Millisecond}, time.Second, true},
		{"ambiguous", wrapf(&captchaai.Request{Kind: captchaai.KindSubmit}, 1, &refusal{kind: ErrAmbiguous, cause: context.DeadlineExceeded, after: defaultRetryAfter}), defaultRetryAfter, true},
		{"unavailable", fmt.Errorf("x: %w", ErrUnavailable), defaultRetryAfter, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after, ok := FailFast(tc.err)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.after, after)
			var ra interface{ RetryAfter() time.Duration }
			if errors.As(tc.err, &ra) {
				require.Equal(t, after, ra.RetryAfter(), "the same wait without importing upstream")
			}
		})
	}
}

func TestIsFailure(t *testing.T) {
	require.False(t, IsFailure(nil))
	require.False(t, IsFailure(context.Canceled))
	require.False(t, IsFailure(&statusError{code: 429}))
	require.False(t, IsFailure(&codeError{code: "ERROR_NO_SLOT_AVAILABLE"}))
	require.True(t, IsFailure(&codeError{code: "ERROR_SERVER_ERROR"}))
	require.True(t, IsFailure(&statusError{code: 502}))
	require.True(t, IsFailure(&DialError{Err: errors.New("refused")}))
	require.True(t, IsFailure(context.DeadlineExceeded))
	require.True(t, IsFailure(fmt.Errorf("%w (%w)", captchaai.ErrNotProtocol, &statusError{code: 200})))
}

func TestConfig(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		c := Config{}.WithDefaults()
		require.Equal(t, DefaultBaseURL, c.BaseURL)
		require.Equal(t, 30*time.Second, c.Timeout)
		require.Equal(t, 5*time.Second, c.MaxWait)
		require.Equal(t, 3, c.MaxAttempts)
		require.Equal(t, 0.2, c.RetryBudget)
		require.Equal(t, 1.0, c.RetryReserve)
		require.Equal(t, int64(1<<20), c.MaxBody)
		require.Equal(t, 5*time.Minute, c.BadKeyTTL)
		require.Zero(t, c.Burst, "no rate, no burst")
		require.NoError(t, c.Validate())
	})
	t.Run("burst follows rate", func(t *testing.T) {
		c := Config{Rate: 2.5, KeyRate: 0.1}.WithDefaults()
		require.Equal(t, 3, c.Burst)
		require.Equal(t, 1, c.KeyBurst)
	})
	t.Run("invalid", func(t *testing.T) {
		for _, u := range []string{"ftp://x", "ocr.captchaai.com", "http://", "https://u:p@x", "https://x/?a=1", "https://x/#f"} {
			_, err := New(Config{BaseURL: u}, nil, nil)
			require.Error(t, err, u)
		}
		err := Config{Rate: -1, MaxInFlight: -1, Timeout: -1}.WithDefaults().Validate()
		require.ErrorContains(t, err, "rate")
		require.ErrorContains(t, err, "max_in_flight")
		require.ErrorContains(t, err, "timeout")
	})
}
