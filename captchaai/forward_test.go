package captchaai

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

func readBody(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	return b
}

func TestOutgoingReplays(t *testing.T) {
	img := fakeImage(3000, 9)
	body, ct := multipartBody(t, part{Name: "key", Value: testKey}, part{Name: "method", Value: "post"},
		part{Name: "file", File: true, Filename: "c.png", Value: string(img)})
	const rawQuery = "json=1&x=a+b%2Fc&a%5B%5D=1&a[]=2&empty=&flag"
	tests := []struct {
		name, method, base, path, query string
		body                            []byte
		wantURL                         string
	}{
		{"multipart submit", "POST", "https://ocr.captchaai.com", "/in.php", rawQuery, body,
			"https://ocr.captchaai.com/in.php?" + rawQuery},
		{"base with slash", "POST", "https://ocr.captchaai.com/", "/in.php", "", body, "https://ocr.captchaai.com/in.php"},
		{"base path prefix", "GET", "http://127.0.0.1:8080/captchaai", "/res.php", "key=k&action=get&id=1", nil,
			"http://127.0.0.1:8080/captchaai/res.php?key=k&action=get&id=1"},
		{"base path prefix with slash", "GET", "http://upstream/v1/", "/res.php", "action=getbalance", nil,
			"http://upstream/v1/res.php?action=getbalance"},
		{"relative request path", "GET", "http://upstream/v1", "in.php", "", nil, "http://upstream/v1/in.php"},
		{"base query and fragment dropped", "GET", "http://upstream/?a=b#frag", "/res.php", "c=d", nil, "http://upstream/res.php?c=d"},
		{"POST with empty body and query (rucaptcha-client)", "POST", "https://ocr.captchaai.com", "/in.php",
			"key=k&method=userrecaptcha", nil, "https://ocr.captchaai.com/in.php?key=k&method=userrecaptcha"},
		{"unparseable query kept verbatim", "GET", "https://ocr.captchaai.com", "/in.php", "a=1;b=%zz", nil,
			"https://ocr.captchaai.com/in.php?a=1;b=%zz"},
		{"empty method is GET", "", "https://ocr.captchaai.com", "/res.php", "", nil, "https://ocr.captchaai.com/res.php"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Parse(tc.method, tc.path, tc.query, hdr(ct), tc.body)
			ctx := context.WithValue(t.Context(), struct{}{}, 1)
			out, err := r.Outgoing(ctx, mustURL(t, tc.base))
			if err != nil {
				t.Fatal(err)
			}
			wantMethod := tc.method
			if wantMethod == "" {
				wantMethod = "GET"
			}
			if out.Method != wantMethod {
				t.Errorf("Method = %q, want %q", out.Method, wantMethod)
			}
			if got := out.URL.String(); got != tc.wantURL {
				t.Errorf("URL = %q, want %q", got, tc.wantURL)
			}
			if out.URL.RawQuery != tc.query {
				t.Errorf("RawQuery = %q, want %q", out.URL.RawQuery, tc.query)
			}
			if out.Context() != ctx {
				t.Error("context not passed on")
			}
			if out.Host != out.URL.Host || out.URL.Host != mustURL(t, tc.base).Host {
				t.Errorf("Host = %q, want the upstream's", out.Host)
			}
			if out.ContentLength != int64(len(tc.body)) {
				t.Errorf("ContentLength = %d, want %d", out.ContentLength, len(tc.body))
			}
			if got := readBody(t, out.Body); !bytes.Equal(got, tc.body) {
				t.Errorf("Body differs: %d bytes, want %d", len(got), len(tc.body))
			}
			if out.GetBody == nil {
				t.Fatal("GetBody is nil")
			}
			for i := range 2 {
				rc, err := out.GetBody()
				if err != nil {
					t.Fatal(err)
				}
				if got := readBody(t, rc); !bytes.Equal(got, tc.body) {
					t.Errorf("GetBody #%d differs: %d bytes, want %d", i+1, len(got), len(tc.body))
				}
			}
			if len(tc.body) == 0 && out.Body != http.NoBody {
				t.Error("empty body is not http.NoBody")
			}
		})
	}
}

func TestOutgoingHeaders(t *testing.T) {
	h := http.Header{}
	keep := map[string][]string{
		"Content-Type":  {"multipart/form-data; boundary=xyz"},
		"User-Agent":    {"python-requests/2.31.0"},
		"Accept":        {"*/*"},
		"Cookie":        {"a=b"},
		"Authorization": {"Bearer end-to-end"},
		"X-Multi":       {"1", "2"},
		"Origin":        {"https://example.com"},
	}
	for k, vs := range keep {
		h[k] = slices.Clone(vs)
	}
	drop := map[string]string{
		"Connection":          "keep-alive, X-Hop, x-lower",
		"Keep-Alive":          "timeout=5",
		"Proxy-Connection":    "keep-alive",
		"Proxy-Authorization": "Basic dXNlcjpwYXNz",
		"Proxy-Authenticate":  "Basic",
		"Te":                  "trailers",
		"Trailer":             "X-T",
		"Transfer-Encoding":   "chunked",
		"Upgrade":             "h2c",
		"Host":                "2captcha.com",
		"Content-Length":      "42",
		"Accept-Encoding":     "gzip, br",
		"Idempotency-Key":     "abc",
		"X-Hop":               "listed in Connection",
		"X-Lower":             "listed in Connection in lower case",
		"X-Second":            "listed in a second Connection line",
	}
	for k, v := range drop {
		h.Set(k, v)
	}
	h.Add("Connection", "X-Second")
	h["x-noncanonical"] = []string{"kept"} // set directly, bypassing canonicalisation
	h["X-Cap"] = make([]string, 1, 4)      // spare capacity exposes shared slices
	h["X-Cap"][0] = "orig"

	r := Parse(http.MethodPost, "/in.php", "", h, []byte("--xyz--\r\n"))
	out, err := r.Outgoing(t.Context(), mustURL(t, "https://ocr.captchaai.com"))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range keep {
		if got := out.Header[k]; !slices.Equal(got, vs) {
			t.Errorf("%s = %q, want %q", k, got, vs)
		}
	}
	for k := range drop {
		if v, ok := out.Header[k]; ok {
			t.Errorf("%s forwarded: %q", k, v)
		}
	}
	if got := out.Header.Get("X-Noncanonical"); got != "kept" {
		t.Errorf("X-Noncanonical = %q", got)
	}
	out.Header.Add("X-Cap", "added")
	out.Header.Set("Accept", "changed")
	if !slices.Equal(h["X-Cap"][:cap(h["X-Cap"])][:1], []string{"orig"}) || h.Get("Accept") != "*/*" ||
		h["X-Cap"][:2][1] != "" {
		t.Error("upstream headers share storage with the client's")
	}
	if h.Get("Connection") == "" || h.Get("Idempotency-Key") == "" {
		t.Error("client headers were modified")
	}
}

// TestOutgoingWire sends the request to a local server and checks what
// arrives: the body twice (GetBody on a redirect), no Go User-Agent when the
// client sent none.
func TestOutgoingWire(t *testing.T) {
	type seen struct {
		method, uri, ua string
		hasUA           bool
		body            []byte
		header          http.Header
	}
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		_, hasUA := req.Header["User-Agent"]
		got = append(got, seen{req.Method, req.RequestURI, req.UserAgent(), hasUA, b, req.Header})
		if req.URL.Path == "/base/in.php" {
			http.Redirect(w, req, "/base/in2.php?"+req.URL.RawQuery, http.StatusTemporaryRedirect)
			return
		}
		io.WriteString(w, "OK|1")
	}))
	defer srv.Close()

	body := []byte(form("key", testKey, "method", "base64", "body", b64(fakeImage(500, 4))))
	h := hdr(formType)
	h.Set("X-Client", "yes")
	r := Parse(http.MethodPost, "/in.php", "json=1&a=%2F", h, body)
	out, err := r.Outgoing(t.Context(), mustURL(t, srv.URL+"/base/"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(out)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 2 {
		t.Fatalf("server saw %d requests, want 2 (307 replays the body)", len(got))
	}
	for i, s := range got {
		if s.method != "POST" || !bytes.Equal(s.body, body) {
			t.Errorf("request %d: %s with %d body bytes, want POST with %d", i, s.method, len(s.body), len(body))
		}
		if s.hasUA {
			t.Errorf("request %d: User-Agent %q sent, the client sent none", i, s.ua)
		}
		if s.header.Get("X-Client") != "yes" || s.header.Get("Content-Type") != formType {
			t.Errorf("request %d: end-to-end headers lost: %v", i, s.header)
		}
	}
	if got[0].uri != "/base/in.php?json=1&a=%2F" {
		t.Errorf("RequestURI = %q", got[0].uri)
	}
}

func TestOutgoingErrors(t *testing.T) {
	r := getQuery("/in.php", "method", "post")
	if _, err := r.Outgoing(t.Context(), nil); err == nil {
		t.Error("nil base: no error")
	}
	bad := Parse("BAD METHOD", "/in.php", "", nil, nil)
	if _, err := bad.Outgoing(t.Context(), mustURL(t, "https://ocr.captchaai.com")); err == nil {
		t.Error("invalid method: no error")
	}
	noHeader := Parse(http.MethodPost, "/in.php", "", nil, []byte("x"))
	out, err := noHeader.Outgoing(t.Context(), mustURL(t, "https://ocr.captchaai.com"))
	if err != nil || out.Header == nil {
		t.Errorf("nil header: %v", err)
	}
}

func TestOutgoingQueryVerbatim(t *testing.T) {
	base := mustURL(t, "https://ocr.captchaai.com")
	for _, q := range []string{"a=1#b", "a=%zz&b=;c", "x=é", "?a", "a=1&&b=2&"} {
		out, err := Parse("GET", "/res.php", q, nil, nil).Outgoing(t.Context(), base)
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		if out.URL.RawQuery != q || out.URL.Fragment != "" || out.URL.RequestURI() != "/res.php?"+q {
			t.Errorf("%q: RawQuery %q Fragment %q RequestURI %q", q, out.URL.RawQuery, out.URL.Fragment, out.URL.RequestURI())
		}
	}
	for _, q := range []string{"a=1\r\nX-Injected: 1", "a= b", "a=\x00", "a=\x7f"} {
		if _, err := Parse("GET", "/res.php", q, nil, nil).Outgoing(t.Context(), base); err == nil {
			t.Errorf("%q: no error", q)
		}
	}
}
