package captchaaitest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
)

// Transport returns an http.RoundTripper that serves requests in-process,
// without any network: usable inside testing/synctest bubbles. The request's
// host is ignored. Faults behave as over HTTP, except that the
// network-level ones come back as RoundTrip errors: FaultReset and
// FaultResetAfter as a *net.OpError (Op "read") wrapping syscall.ECONNRESET,
// an outage (and a closed Server) as a *net.OpError with Op "dial" wrapping
// syscall.ECONNREFUSED, FaultTimeout and Latency as the request context's
// error once it is done. Nothing keeps running after RoundTrip returns.
func (s *Server) Transport() http.RoundTripper { return transport{s} }

type transport struct{ s *Server }

// addr is the remote address named in transport errors.
type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }

func remote(req *http.Request) net.Addr {
	h := req.URL.Host
	if _, _, err := net.SplitHostPort(h); err != nil {
		h = net.JoinHostPort(h, "80")
	}
	return addr(h)
}

// refusedError is what a dial to a dead server returns.
func refusedError(req *http.Request) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: remote(req), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

// resetError is what reading from a reset connection returns.
func resetError(req *http.Request) error {
	return &net.OpError{Op: "read", Net: "tcp", Addr: remote(req), Err: os.NewSyscallError("read", syscall.ECONNRESET)}
}

// RoundTrip serves req in-process.
func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	s := t.s
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(io.LimitReader(req.Body, s.cfg.maxBody+1))
		_ = req.Body.Close() // a RoundTripper must close the body
		if err != nil {
			return nil, fmt.Errorf("captchaaitest: read request body: %w", err)
		}
		body = b
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("captchaaitest: %w", err)
	}
	if !s.enter() {
		return nil, refusedError(req)
	}
	defer s.wg.Done()

	u := *req.URL
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	host := req.Host
	if host == "" {
		host = u.Host
	}
	sr := (&http.Request{
		Method:        method,
		URL:           &u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          host,
		RemoteAddr:    "127.0.0.1:1",
		RequestURI:    u.RequestURI(),
	}).WithContext(ctx)

	rep := s.serve(sr)
	switch rep.kind {
	case replyWrite:
	case replyRefuse:
		return nil, refusedError(req)
	case replyAbort:
		if rep.err != nil && !errors.Is(rep.err, errClosed) {
			return nil, fmt.Errorf("captchaaitest: %w", rep.err)
		}
		return nil, resetError(req)
	default:
		return nil, resetError(req)
	}
	h := rep.header.Clone()
	h.Set("Content-Length", strconv.Itoa(len(rep.body)))
	respBody := rep.body
	if method == http.MethodHead {
		respBody = nil
	}
	return &http.Response{
		Status:        strconv.Itoa(rep.status) + " " + http.StatusText(rep.status),
		StatusCode:    rep.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(respBody)),
		ContentLength: int64(len(rep.body)),
		Request:       req,
	}, nil
}
