package pingback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// sender performs single delivery attempts.
type sender struct {
	client  *http.Client
	post    bool
	maxResp int64
	timeout time.Duration
}

// newSender returns a sender for cfg. rt nil means a transport that dials
// only addresses rule allows and never uses an HTTP proxy from the
// environment (a proxy would dial on our behalf, unchecked).
func newSender(cfg Config, rule *Rule, rt http.RoundTripper) *sender {
	if rt == nil {
		rt = &http.Transport{
			Proxy:                  nil,
			DialContext:            rule.DialContext(cfg.Timeout),
			TLSHandshakeTimeout:    cfg.Timeout,
			ResponseHeaderTimeout:  cfg.Timeout,
			MaxIdleConns:           cfg.Workers,
			MaxIdleConnsPerHost:    cfg.HostWorkers,
			IdleConnTimeout:        30 * time.Second,
			MaxResponseHeaderBytes: 16 << 10,
		}
	}
	return &sender{
		client: &http.Client{
			Transport: rt,
			// A redirect is not followed: the receiver answered, but not
			// with a success.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		post:    strings.EqualFold(cfg.Method, http.MethodPost),
		maxResp: cfg.MaxResponse,
		timeout: cfg.Timeout,
	}
}

// close drops idle connections.
func (s *sender) close() { s.client.CloseIdleConnections() }

// attemptError is a failed delivery attempt.
type attemptError struct {
	msg     string // safe to log and store: no query string, no API key
	retry   bool   // a later attempt may succeed (connection error, timeout, 5xx)
	refused bool   // the allow rule refused the resolved address
}

func (e *attemptError) Error() string { return e.msg }

// request builds the call CaptchaAI would make: GET target with id and code
// appended to its query, or a form POST of id and code to target.
func (s *sender) request(ctx context.Context, target, id, code string) (*http.Request, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("pingback: parse target: %w", err)
	}
	u.Fragment, u.RawFragment = "", ""
	q := "id=" + url.QueryEscape(id) + "&code=" + url.QueryEscape(code)
	if s.post {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(q))
		if err != nil {
			return nil, fmt.Errorf("pingback: build request: %w", err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return req, nil
	}
	if u.RawQuery != "" {
		u.RawQuery += "&" + q
	} else {
		u.RawQuery = q
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), http.NoBody)
	if err != nil {
		return nil, fmt.Errorf("pingback: build request: %w", err)
	}
	return req, nil
}

// send makes one attempt, bounded by the configured timeout, and returns
// nil or an *attemptError. A 2xx answer is a delivery; connection errors,
// timeouts, 5xx, 408 and 429 may be retried; any other answer (redirects
// included) is final. At most maxResp bytes of the answer are read.
func (s *sender) send(ctx context.Context, target, id, code string) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := s.request(ctx, target, id, code)
	if err != nil {
		return &attemptError{msg: err.Error()}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if errors.Is(err, ErrRefused) {
			return &attemptError{msg: describe(err), refused: true}
		}
		return &attemptError{msg: describe(err), retry: true}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, s.maxResp))
	_ = resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		return nil
	case c >= 500, c == http.StatusRequestTimeout, c == http.StatusTooManyRequests:
		return &attemptError{msg: "receiver answered HTTP " + strconv.Itoa(c), retry: true}
	default:
		return &attemptError{msg: "receiver answered HTTP " + strconv.Itoa(c)}
	}
}

// describe returns err's text without the request URL (which may carry a
// receiver's secret in its query).
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return err.Error()
}
