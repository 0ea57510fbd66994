package captchaai

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseRequest: Parse never panics; Fingerprint and Outgoing never
// panic on what it understood; parsing is deterministic.
func FuzzParseRequest(f *testing.F) {
	img := fakeImage(200, 5)
	enc := b64(img)
	mp, mpType := multipartBody(f,
		part{Name: "key", Value: testKey}, part{Name: "method", Value: "post"}, part{Name: "json", Value: "0"},
		part{Name: "soft_id", Value: "4585"}, part{Name: "file", File: true, Filename: "file", Type: "application/octet-stream", Value: string(img)})
	mpPy, mpPyType := multipartBody(f,
		part{Name: "key", Value: testKey}, part{Name: "method", Value: "post"},
		part{Name: "file", File: true, Filename: "captcha.png", Value: string(img)},
		part{Name: "imginstructions", File: true, Filename: "hint.png", Value: "hint"})
	mpPoll, mpPollType := multipartBody(f,
		part{Name: "key", Value: testKey}, part{Name: "action", Value: "get"}, part{Name: "id", Value: "123"}, part{Name: "json", Value: "1"})
	mpBLS, mpBLSType := multipartBody(f,
		part{Name: "key", Value: testKey}, part{Name: "method", Value: "bls"}, part{Name: "instructions", Value: "664"},
		part{Name: "image_base64_1", Value: "data:image/gif;base64," + enc}, part{Name: "image_base64_2", Value: enc})
	seeds := []struct {
		method, path, query, ctype string
		body                       []byte
	}{
		{"GET", "/in.php", form("key", testKey, "method", "userrecaptcha", "googlekey", siteKey, "pageurl", pageURL, "json", "1"), "", nil},
		{"GET", "/in.php", form("key", testKey, "method", "turnstile", "sitekey", "0x4AAA", "pageurl", pageURL, "header_acao", "1", "soft_id", "4587"), "", nil},
		{"POST", "/in.php", "", formType, []byte(form("key", testKey, "method", "base64", "body", enc, "numeric", "1"))},
		{"POST", "/in.php", "", formType, []byte("key=" + testKey + "&method=base64&body=" + enc)},
		{"POST", "/in.php", "", mpType, mp},
		{"POST", "/in.php", "", mpPyType, mpPy},
		{"POST", "/res.php", "", mpPollType, mpPoll},
		{"POST", "/in.php", "", mpBLSType, mpBLS},
		{"POST", "/in.php", form("key", testKey, "method", "userrecaptcha", "version", "v3", "action", "verify"), "", nil},
		{"POST", "/in.php", "", "application/json", []byte(`{"key":"` + testKey + `","method":"base64","body":"` + enc + `","json":1,"soft_id":4584}`)},
		{"POST", "/in.php", "", "text/plain;charset=UTF-8", []byte(`{"method":"userrecaptcha","invisible":true,"data":{"a":[1,2]}}`)},
		{"POST", "/res.php", "key=" + testKey + "&action=getbalance", "application/json", []byte(`{"json":1}`)},
		{"GET", "/res.php", "key=" + testKey + "&action=get&id=73046487691", "", nil},
		{"GET", "/res.php", "key=" + testKey + "&action=get&ids=1,2,3&json=1", "", nil},
		{"GET", "/res.php", "key=" + testKey + "&action=reportbad&id=1", "", nil},
		{"GET", "/solve.php", "method=post", "", nil},
		{"GET", "/in.php", "a=1;b=%zz#frag", "", nil},
		{"POST", "/in.php", "", "multipart/form-data; boundary=x", []byte("--x\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nb\r\n--x--\r\n")},
		{"PUT", "/in.php", "", "application/json", []byte(`{"key":1}`)},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.query, s.ctype, s.body)
	}
	base := mustURL(f, "https://ocr.captchaai.com/prefix")
	f.Fuzz(func(t *testing.T, method, path, query, ctype string, body []byte) {
		r1 := Parse(method, path, query, hdr(ctype), body)
		r2 := Parse(method, path, query, hdr(ctype), bytes.Clone(body))
		if r1.Understood != r2.Understood || r1.Kind != r2.Kind || r1.Format != r2.Format || r1.Key() != r2.Key() {
			t.Fatal("Parse is not deterministic")
		}
		if _, ok := r1.Params["key"]; ok {
			t.Fatal("key left in Params")
		}
		fp := r1.Fingerprint()
		if fp != r2.Fingerprint() || fp != r1.Fingerprint() {
			t.Fatal("Fingerprint is not deterministic")
		}
		if !strings.HasPrefix(fp, r1.Account()+":") {
			t.Fatalf("Fingerprint %q lacks the account prefix", fp)
		}
		if !r1.Understood {
			return
		}
		out, err := r1.Outgoing(t.Context(), base)
		if err != nil {
			return // an invalid method or query: reported, not replayed
		}
		if out.URL.RawQuery != query {
			t.Fatalf("query %q replayed as %q", query, out.URL.RawQuery)
		}
		if m := method; m != "" && out.Method != m {
			t.Fatalf("method %q replayed as %q", m, out.Method)
		}
		rc, err := out.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		got.ReadFrom(rc)
		if !bytes.Equal(got.Bytes(), body) {
			t.Fatal("body not replayed byte for byte")
		}
	})
}

// FuzzParseAnswer: ParseAnswer never panics; a parsed answer renders back
// to its own bytes in its own format, and its rendering in the other format
// parses to the same Status and Value.
func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{
		"OK|73046487691", "OK|a|b|c", "OK|", "CAPCHA_NOT_READY", "ERROR_CAPTCHA_UNSOLVABLE", "ERROR: 1001",
		"IP_BANNED", "MAX_USER_TURN", "1.234", "", "OK_REPORT_RECORDED", "OK",
		`{"status":1,"request":"73046487691"}`, `{"status":1,"request":73046487691}`,
		`{"status":0,"request":"CAPCHA_NOT_READY"}`, `{"status":0,"request":"ERROR_WRONG_USER_KEY","error_text":"x"}`,
		`{"status":"1","request":"tok","useragent":"UA"}`, `{"status":1,"request":{"geetest_challenge":"c"}}`,
		`{"status":1,"request":null}`, `{"status":1}`,
		"<html><body>502 Bad Gateway</body></html>", "\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := ParseAnswer(body)
		if err != nil {
			if !errors.Is(err, ErrNotProtocol) {
				t.Fatalf("error %v is not ErrNotProtocol", err)
			}
			return
		}
		_ = a.Terminal()
		_ = Classify(a.Value)
		if got := a.Render(a.Format); !bytes.Equal(got, body) {
			t.Fatalf("Render(%v) = %q, want the body %q", a.Format, got, body)
		}
		other := FormatJSON
		if a.Format == FormatJSON {
			other = FormatText
		}
		rendered := a.Render(other)
		b, err := ParseAnswer(rendered)
		if err != nil {
			t.Fatalf("rendering %q as %v gave %q, which does not parse: %v", body, other, rendered, err)
		}
		if b.Status != a.Status {
			t.Fatalf("%q as %v = %q: status %v, want %v", body, other, rendered, b.Status, a.Status)
		}
		// JSON cannot carry invalid UTF-8: it becomes U+FFFD.
		if utf8.ValidString(a.Value) && b.Value != a.Value {
			t.Fatalf("%q as %v = %q: value %q, want %q", body, other, rendered, b.Value, a.Value)
		}
		if _, err := ParseAnswer(b.Render(a.Format)); err != nil {
			t.Fatalf("round trip back to %v does not parse: %v", a.Format, err)
		}
	})
}

// FuzzDecodeBase64Image checks the single-pass decoder against the
// original implementation (refDecodeBase64Image) and the fingerprint's
// streaming use of it against DecodeBase64Image.
func FuzzDecodeBase64Image(f *testing.F) {
	for _, s := range []string{"", "YQ==", "YWI", "YR", "data:image/png;base64,iVBORw0KGgo=", "ab+/", "ab-_", "ab+_",
		"YQ= =", "Y\r\nQ\t=", " YWJj ", "a b", "====", "data:,", "data:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, gok := DecodeBase64Image(s)
		want, wok := refDecodeBase64Image(s)
		if gok != wok || !bytes.Equal(got, want) {
			t.Fatalf("DecodeBase64Image(%q) = %q, %v; reference %q, %v", s, got, gok, want, wok)
		}
		sum, ok := hashBase64Image(s)
		if ok != gok || ok && sum != sha256Sum(got) {
			t.Fatalf("hashBase64Image(%q) disagrees with DecodeBase64Image", s)
		}
	})
}
