package captchaai

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// hopHeaders are not forwarded upstream (RFC 9110 §7.6.1), nor are our own
// control headers and the ones the transport sets itself.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Host", "Content-Length", "Accept-Encoding", "Idempotency-Key",
}

// Outgoing builds the upstream request that replays r unchanged (method,
// path, query, body, end-to-end headers) against base, e.g.
// https://ocr.captchaai.com. The body is replayable (GetBody is set).
func (r *Request) Outgoing(ctx context.Context, base *url.URL) (*http.Request, error) {
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + r.Path
	u.RawPath = ""
	u.RawQuery = r.RawQuery
	method := r.HTTPMethod
	if method == "" {
		method = http.MethodGet
	}
	out, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(r.Body))
	if err != nil {
		return nil, fmt.Errorf("captchaai: build upstream request: %w", err)
	}
	if len(r.Body) == 0 {
		out.Body, out.GetBody, out.ContentLength = http.NoBody, nil, 0
	}
	for k, vs := range r.Header {
		out.Header[k] = vs
	}
	if c := r.Header.Get("Connection"); c != "" {
		for _, f := range strings.Split(c, ",") {
			out.Header.Del(strings.TrimSpace(f))
		}
	}
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	return out, nil
}
