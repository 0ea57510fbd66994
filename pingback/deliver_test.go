package pingback

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// rtFunc is an http.RoundTripper from a function.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func respond(r *http.Request, status int, body io.Reader) *http.Response {
	return &http.Response{StatusCode: status, Body: io.NopCloser(body), Header: http.Header{}, Request: r}
}

func TestRequestFormat(t *testing.T) {
	var got *http.Request
	var body string
	rt := rtFunc(func(r *http.Request) (*http.Response, error) {
		got = r
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		return respond(r, 200, strings.NewReader("OK")), nil
	})
	cfg := DefaultConfig()
	s := newSender(cfg, nil, rt)
	ctx := context.Background()

	require.NoError(t, s.send(ctx, "http://h.example/cb", "123", "a b&c"))
	require.Equal(t, http.MethodGet, got.Method)
	require.Equal(t, "http://h.example/cb?id=123&code=a+b%26c", got.URL.String())

	require.NoError(t, s.send(ctx, "http://h.example/cb?client=7#frag", "123", "TOKEN"))
	require.Equal(t, "http://h.example/cb?client=7&id=123&code=TOKEN", got.URL.String())

	cfg.Method = "POST"
	s = newSender(cfg, nil, rt)
	require.NoError(t, s.send(ctx, "http://h.example/cb?client=7", "123", "ERROR_CAPTCHA_UNSOLVABLE"))
	require.Equal(t, http.MethodPost, got.Method)
	require.Equal(t, "http://h.example/cb?client=7", got.URL.String())
	require.Equal(t, "application/x-www-form-urlencoded", got.Header.Get("Content-Type"))
	require.Equal(t, "id=123&code=ERROR_CAPTCHA_UNSOLVABLE", body)
}

// countingReader counts the bytes read from an endless body.
type countingReader struct{ n atomic.Int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}

func TestOutcomeClassesAndBodyLimit(t *testing.T) {
	cases := []struct {
		status       int
		err          error
		ok, retrying bool
	}{
		{200, nil, true, false},
		{204, nil, true, false},
		{500, nil, false, true},
		{503, nil, false, true},
		{429, nil, false, true},
		{408, nil, false, true},
		{404, nil, false, false},
		{302, nil, false, false},
		{0, syscall.ECONNREFUSED, false, true},
		{0, context.DeadlineExceeded, false, true},
	}
	for _, c := range cases {
		body := &countingReader{}
		rt := rtFunc(func(r *http.Request) (*http.Response, error) {
			if c.err != nil {
				return nil, c.err
			}
			return respond(r, c.status, body), nil
		})
		s := newSender(DefaultConfig(), nil, rt)
		err := s.send(context.Background(), "http://h.example/cb", "1", "x")
		if c.ok {
			require.NoError(t, err, c.status)
		} else {
			var ae *attemptError
			require.True(t, errors.As(err, &ae), c.status)
			require.Equal(t, c.retrying, ae.retry, "%d %v", c.status, c.err)
			require.NotContains(t, ae.msg, "h.example", "errors do not carry the URL")
		}
		require.LessOrEqual(t, body.n.Load(), int64(4<<10), "body read beyond the limit")
	}
}
