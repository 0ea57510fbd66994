package captchaai

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"testing"
)

// testKey is a plausible 32-character CaptchaAI key.
const testKey = "0123456789abcdef0123456789abcdef"

// otherKey is a second account's key.
const otherKey = "fedcba9876543210fedcba9876543210"

// part is one multipart part for multipartBody: a text field when File is
// false, else a file part with Filename (sent verbatim, even if empty).
type part struct {
	Name     string
	Value    string
	File     bool
	Filename string
	Type     string // Content-Type of a file part; "" for none
}

// multipartBody encodes parts the way real clients do and returns the body
// and its Content-Type.
func multipartBody(t testing.TB, parts ...part) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p.File {
			h.Set("Content-Disposition", `form-data; name="`+p.Name+`"; filename="`+p.Filename+`"`)
			if p.Type != "" {
				h.Set("Content-Type", p.Type)
			}
		} else {
			h.Set("Content-Disposition", `form-data; name="`+p.Name+`"`)
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pw.Write([]byte(p.Value)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), w.FormDataContentType()
}

// hdr returns a header with the given Content-Type ("" for none).
func hdr(contentType string) http.Header {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return h
}

// form encodes alternating name, value pairs in order (url.Values would sort
// them, and order is part of what some tests vary).
func form(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if b.Len() > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(kv[i]))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(kv[i+1]))
	}
	return b.String()
}

const formType = "application/x-www-form-urlencoded"

// postForm parses an in.php POST with a urlencoded body.
func postForm(kv ...string) *Request {
	return Parse(http.MethodPost, "/in.php", "", hdr(formType), []byte(form(kv...)))
}

// getQuery parses a GET of path with the pairs in the query.
func getQuery(path string, kv ...string) *Request {
	return Parse(http.MethodGet, path, form(kv...), http.Header{}, nil)
}

// fakeImage returns n pseudo-random bytes starting with the PNG signature;
// seed picks the picture.
func fakeImage(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	copy(b, "\x89PNG\r\n\x1a\n")
	return b
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }
