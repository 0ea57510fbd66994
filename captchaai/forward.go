package captchaai

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
)

// dropHeader reports whether a request header (canonical form) is not
// forwarded upstream: hop-by-hop headers (RFC 9110 §7.6.1), Host and
// Content-Length (the transport sets them), Accept-Encoding (the transport
// negotiates and decodes compression itself) and solveonce's own control
// header Idempotency-Key.
func dropHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Host", "Content-Length", "Accept-Encoding", "Idempotency-Key":
		return true
	}
	return false
}

// Outgoing builds the upstream request that replays r unchanged (method,
// path, query, body, end-to-end headers) against base, e.g.
// https://ocr.captchaai.com; a base path such as /captchaai is prefixed to
// the request path. The body is replayable: GetBody is always set and may be
// called any number of times. Headers are copied, never shared with r, less
// the ones dropHeader names and the ones the Connection header lists; if
// the client sent no User-Agent, none is sent (Go's default is suppressed).
func (r *Request) Outgoing(ctx context.Context, base *url.URL) (*http.Request, error) {
	if base == nil {
		return nil, errors.New("captchaai: build upstream request: nil base URL")
	}
	if !validRawQuery(r.RawQuery) {
		return nil, errors.New("captchaai: build upstream request: control character in query")
	}
	u := *base
	u.Path = joinPath(base.Path, r.Path)
	u.RawPath = ""
	u.RawQuery = ""
	u.ForceQuery = false
	u.Fragment, u.RawFragment = "", ""
	method := r.HTTPMethod
	if method == "" {
		method = http.MethodGet
	}
	out, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("captchaai: build upstream request: %w", err)
	}
	// Set the query after parsing: reparsing would cut it at a '#', which a
	// server-side request can contain (it has no fragment).
	out.URL.RawQuery = r.RawQuery
	body := r.Body
	out.ContentLength = int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) {
		if len(body) == 0 {
			return http.NoBody, nil
		}
		return io.NopCloser(bytes.NewReader(body)), nil
	}
	out.Body, _ = out.GetBody()

	var listed []string // headers named by Connection
	for _, v := range r.Header.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				listed = append(listed, textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	for k, vs := range r.Header {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if dropHeader(ck) || containsFold(listed, ck) {
			continue
		}
		out.Header[ck] = append(out.Header[ck], vs...)
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // net/http then sends none
	}
	return out, nil
}

// validRawQuery reports whether q can go into a request line as it is: no
// control characters or spaces, which a parsed server request cannot hold
// but a hand-made Request could (and which would split the request line).
func validRawQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		if q[i] <= ' ' || q[i] == 0x7f {
			return false
		}
	}
	return true
}

// joinPath joins a base path and a request path with exactly one slash.
func joinPath(base, p string) string {
	base = strings.TrimSuffix(base, "/")
	if p == "" {
		if base == "" {
			return "/"
		}
		return base
	}
	if p[0] != '/' {
		p = "/" + p
	}
	return base + p
}

func containsFold(list []string, s string) bool {
	for _, l := range list {
		if strings.EqualFold(l, s) {
			return true
		}
	}
	return false
}
