package captchaai

import (
	"bytes"
	"errors"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// wantReq is what a parse must produce; zero fields of Params/Files are
// not checked unless listed.
type wantReq struct {
	kind       Kind
	method     string
	action     string
	id         string
	ids        []string
	format     Format
	acao       bool
	key        string
	params     map[string]string // exact values; "" means present and empty
	absent     []string          // params that must not be present
	files      []File
	understood bool
}

func checkReq(t *testing.T, r *Request, w wantReq) {
	t.Helper()
	if r.Kind != w.kind {
		t.Errorf("Kind = %v, want %v", r.Kind, w.kind)
	}
	if r.Method != w.method {
		t.Errorf("Method = %q, want %q", r.Method, w.method)
	}
	if r.Action != w.action {
		t.Errorf("Action = %q, want %q", r.Action, w.action)
	}
	if r.ID != w.id {
		t.Errorf("ID = %q, want %q", r.ID, w.id)
	}
	if !slices.Equal(r.IDs, w.ids) {
		t.Errorf("IDs = %q, want %q", r.IDs, w.ids)
	}
	if r.Format != w.format {
		t.Errorf("Format = %v, want %v", r.Format, w.format)
	}
	if r.ACAO != w.acao {
		t.Errorf("ACAO = %v, want %v", r.ACAO, w.acao)
	}
	if r.Key() != w.key {
		t.Errorf("Key() = %q, want %q", r.Key(), w.key)
	}
	if _, ok := r.Params["key"]; ok {
		t.Errorf("Params still holds the key: %q", r.Params["key"])
	}
	for k, v := range w.params {
		got, ok := r.Params[k]
		if !ok {
			t.Errorf("Params[%q] missing, want %q", k, v)
			continue
		}
		if len(got) != 1 || got[0] != v {
			t.Errorf("Params[%q] = %q, want [%q]", k, got, v)
		}
	}
	for _, k := range w.absent {
		if _, ok := r.Params[k]; ok {
			t.Errorf("Params[%q] = %q, want absent", k, r.Params[k])
		}
	}
	if w.files != nil || len(r.Files) > 0 {
		if len(r.Files) != len(w.files) {
			t.Fatalf("Files = %d, want %d: %+v", len(r.Files), len(w.files), r.Files)
		}
		for i, f := range w.files {
			g := r.Files[i]
			if g.Field != f.Field || g.Name != f.Name || !bytes.Equal(g.Data, f.Data) {
				t.Errorf("Files[%d] = {%q %q %d bytes}, want {%q %q %d bytes}",
					i, g.Field, g.Name, len(g.Data), f.Field, f.Name, len(f.Data))
			}
		}
	}
	if r.Understood != w.understood {
		t.Errorf("Understood = %v, want %v", r.Understood, w.understood)
	}
}

const (
	siteKey = "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"
	pageURL = "https://www.google.com/recaptcha/api2/demo"
)

// goMultipart builds a body the way 2captcha-go does: CreateFormFile with
// filepath.Base of the path, WriteField for the rest.
func goMultipart(t *testing.T, file string, data []byte, fields ...string) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		if err := w.WriteField(fields[i], fields[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	fw, err := w.CreateFormFile("file", filepath.Base(file))
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(data)
	w.Close()
	return buf.Bytes(), w.FormDataContentType()
}

func TestParseEncodings(t *testing.T) {
	img := fakeImage(300, 7)
	imgB64 := b64(img)

	phpBody, phpType := multipartBody(t,
		part{Name: "key", Value: testKey},
		part{Name: "method", Value: "post"},
		part{Name: "json", Value: "0"},
		part{Name: "soft_id", Value: "4585"},
		part{Name: "numeric", Value: "1"},
		part{Name: "file", File: true, Filename: "file", Type: "application/octet-stream", Value: string(img)},
	)
	pyBody, pyType := multipartBody(t,
		part{Name: "key", Value: testKey},
		part{Name: "method", Value: "post"},
		part{Name: "file", File: true, Filename: "captcha.png", Value: string(img)},
	)
	goBody, goType := goMultipart(t, "/tmp/captchas/captcha.jpg", img, "key", testKey, "method", "post", "soft_id", "4583")
	rucapBody, rucapType := multipartBody(t, // python-rucaptcha polls with multipart
		part{Name: "key", Value: testKey},
		part{Name: "action", Value: "get"},
		part{Name: "id", Value: "73046487691"},
		part{Name: "json", Value: "1"},
	)
	sharpBody, sharpType := multipartBody(t, // CaptchaSharp submits tokens as multipart
		part{Name: "key", Value: testKey},
		part{Name: "method", Value: "turnstile"},
		part{Name: "sitekey", Value: "0x4AAAAAAAC3DHQFLr1GavRN"},
		part{Name: "pageurl", Value: "https://example.com/login"},
		part{Name: "header_acao", Value: "1"},
	)
	pathBody, pathType := multipartBody(t,
		part{Name: "key", Value: testKey},
		part{Name: "method", Value: "post"},
		part{Name: "file", File: true, Filename: "dir/sub/captcha.gif", Value: "GIF89a"},
	)
	emptyFnBody, emptyFnType := multipartBody(t,
		part{Name: "method", Value: "post"},
		part{Name: "file", File: true, Filename: "", Value: ""},
	)

	tests := []struct {
		name string
		req  *Request
		want wantReq
	}{
		{
			name: "GET in.php query userrecaptcha",
			req: getQuery("/in.php", "key", testKey, "method", "userrecaptcha", "googlekey", siteKey,
				"pageurl", pageURL, "json", "1", "data-s", "abc", "userAgent", "Mozilla/5.0"),
			want: wantReq{kind: KindSubmit, method: "userrecaptcha", format: FormatJSON, key: testKey, understood: true,
				params: map[string]string{"googlekey": siteKey, "pageurl": pageURL, "data-s": "abc", "userAgent": "Mozilla/5.0", "json": "1"}},
		},
		{
			name: "POST urlencoded base64 image",
			req:  postForm("key", testKey, "method", "base64", "body", imgB64, "soft_id", "4580", "data[key]", "v"),
			want: wantReq{kind: KindSubmit, method: "base64", key: testKey, understood: true,
				params: map[string]string{"body": imgB64, "soft_id": "4580", "data[key]": "v"}},
		},
		{
			name: "POST urlencoded with charset",
			req: Parse(http.MethodPost, "/in.php", "", hdr("application/x-www-form-urlencoded; charset=UTF-8"),
				[]byte(form("key", testKey, "method", "turnstile", "sitekey", "0x4AAA"))),
			want: wantReq{kind: KindSubmit, method: "turnstile", key: testKey, understood: true,
				params: map[string]string{"sitekey": "0x4AAA"}},
		},
		{
			name: "POST multipart PHP cURL filename file",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(phpType), phpBody),
			want: wantReq{kind: KindSubmit, method: "post", key: testKey, understood: true,
				params: map[string]string{"json": "0", "soft_id": "4585", "numeric": "1"},
				absent: []string{"file"},
				files:  []File{{Field: "file", Name: "file", Data: img}}},
		},
		{
			name: "POST multipart python basename",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(pyType), pyBody),
			want: wantReq{kind: KindSubmit, method: "post", key: testKey, understood: true,
				files: []File{{Field: "file", Name: "captcha.png", Data: img}}},
		},
		{
			name: "POST multipart Go filepath.Base",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(goType), goBody),
			want: wantReq{kind: KindSubmit, method: "post", key: testKey, understood: true,
				params: map[string]string{"soft_id": "4583"},
				files:  []File{{Field: "file", Name: "captcha.jpg", Data: img}}},
		},
		{
			name: "POST multipart filename kept as sent",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(pathType), pathBody),
			want: wantReq{kind: KindSubmit, method: "post", key: testKey, understood: true,
				files: []File{{Field: "file", Name: "dir/sub/captcha.gif", Data: []byte("GIF89a")}}},
		},
		{
			name: "POST multipart empty filename is a file",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(emptyFnType), emptyFnBody),
			want: wantReq{kind: KindSubmit, method: "post", understood: true, absent: []string{"file"},
				files: []File{{Field: "file", Name: "", Data: nil}}},
		},
		{
			name: "POST multipart text parts only res.php poll",
			req:  Parse(http.MethodPost, "/res.php", "", hdr(rucapType), rucapBody),
			want: wantReq{kind: KindResult, action: "get", id: "73046487691", format: FormatJSON, key: testKey, understood: true},
		},
		{
			name: "POST multipart token submit with header_acao",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(sharpType), sharpBody),
			want: wantReq{kind: KindSubmit, method: "turnstile", acao: true, key: testKey, understood: true,
				params: map[string]string{"sitekey": "0x4AAAAAAAC3DHQFLr1GavRN", "pageurl": "https://example.com/login"}},
		},
		{
			name: "POST all params in query empty body",
			req: Parse(http.MethodPost, "/in.php", form("key", testKey, "method", "userrecaptcha", "googlekey", siteKey,
				"pageurl", pageURL, "version", "v3", "action", "verify", "min_score", "0.3"), hdr(formType), nil),
			want: wantReq{kind: KindSubmit, method: "userrecaptcha", key: testKey, understood: true,
				params: map[string]string{"version": "v3", "action": "verify", "min_score": "0.3"}},
		},
		{
			name: "POST JSON application/json numbers stay text",
			req: Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
				[]byte(`{"key":"`+testKey+`","method":"base64","body":"`+imgB64+`","json":1,"soft_id":4584,"min_len":4,"filename":"x.png","ext":"png"}`)),
			want: wantReq{kind: KindSubmit, method: "base64", format: FormatJSON, key: testKey, understood: true,
				params: map[string]string{"body": imgB64, "json": "1", "soft_id": "4584", "min_len": "4", "filename": "x.png", "ext": "png"}},
		},
		{
			name: "POST JSON application/json charset",
			req: Parse(http.MethodPost, "/in.php", "", hdr("application/json; charset=utf-8"),
				[]byte(`{"key":"`+testKey+`","method":"turnstile","header_acao":1}`)),
			want: wantReq{kind: KindSubmit, method: "turnstile", acao: true, key: testKey, understood: true},
		},
		{
			name: "POST JSON text/plain from fetch",
			req: Parse(http.MethodPost, "/in.php", "", hdr("text/plain;charset=UTF-8"),
				[]byte(`{"key":"`+testKey+`","method":"userrecaptcha","json":"1"}`)),
			want: wantReq{kind: KindSubmit, method: "userrecaptcha", format: FormatJSON, key: testKey, understood: true},
		},
		{
			name: "POST JSON without content type",
			req: Parse(http.MethodPost, "/in.php", "", http.Header{},
				[]byte("\n  {\"key\":\""+testKey+"\",\"method\":\"hcaptcha\",\"json\":1}\n")),
			want: wantReq{kind: KindSubmit, method: "hcaptcha", format: FormatJSON, key: testKey, understood: true},
		},
		{
			name: "POST JSON booleans null nested and number literals",
			req: Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
				[]byte(`{"method":"userrecaptcha","invisible":true,"enterprise":false,"cookies":null,`+
					`"data":{"b": [1, 2],"a":"x"},"min_score":0.30,"big":12345678901234567890,"json":true,"esc":"a\u00e9\n"}`)),
			want: wantReq{kind: KindSubmit, method: "userrecaptcha", format: FormatJSON, understood: true,
				params: map[string]string{"invisible": "1", "enterprise": "", "cookies": "",
					"data": `{"b":[1,2],"a":"x"}`, "min_score": "0.30", "big": "12345678901234567890", "json": "1", "esc": "a\u00e9\n"}},
		},
		{
			name: "2captcha-ruby getbalance key in query JSON body",
			req: Parse(http.MethodPost, "/res.php", form("key", testKey, "action", "getbalance"), hdr("application/json"),
				[]byte(`{"json":1}`)),
			want: wantReq{kind: KindBalance, action: "getbalance", format: FormatJSON, key: testKey, understood: true},
		},
		{
			name: "merged query and body body wins",
			req: Parse(http.MethodPost, "/in.php", form("key", otherKey, "json", "0", "method", "post", "pageurl", "https://q/"),
				hdr(formType), []byte(form("key", testKey, "json", "1", "method", "base64", "body", imgB64))),
			want: wantReq{kind: KindSubmit, method: "base64", format: FormatJSON, key: testKey, understood: true,
				params: map[string]string{"pageurl": "https://q/", "body": imgB64}},
		},
		{
			name: "key only in query of a POST",
			req: Parse(http.MethodPost, "/in.php", form("key", testKey), hdr(formType),
				[]byte(form("method", "post"))),
			want: wantReq{kind: KindSubmit, method: "post", key: testKey, understood: true},
		},
		{
			name: "key only in body",
			req:  postForm("method", "geetest", "key", testKey, "gt", "g", "challenge", "c"),
			want: wantReq{kind: KindSubmit, method: "geetest", key: testKey, understood: true,
				params: map[string]string{"gt": "g", "challenge": "c"}},
		},
		{
			name: "no key",
			req:  getQuery("/res.php", "action", "get", "id", "1"),
			want: wantReq{kind: KindResult, action: "get", id: "1", understood: true},
		},
		{
			name: "repeated names last wins like PHP",
			req: Parse(http.MethodGet, "/in.php", "key="+otherKey+"&key="+testKey+"&json=1&json=0&method=x&method=turnstile&a[]=1&a[]=2",
				nil, nil),
			want: wantReq{kind: KindSubmit, method: "turnstile", key: testKey, understood: true,
				params: map[string]string{"json": "0"}},
		},
		{
			name: "plus in urlencoded base64 becomes space",
			req:  Parse(http.MethodPost, "/in.php", "", hdr(formType), []byte("method=base64&body=ab+c/d==")),
			want: wantReq{kind: KindSubmit, method: "base64", understood: true, params: map[string]string{"body": "ab c/d=="}},
		},
		{
			name: "bulk get ids",
			req:  getQuery("/res.php", "key", testKey, "action", "get", "ids", "1,2,3"),
			want: wantReq{kind: KindMultiResult, action: "get", key: testKey, ids: []string{"1", "2", "3"}, understood: true},
		},
		{
			name: "action in in.php is a task parameter",
			req: getQuery("/in.php", "key", testKey, "method", "userrecaptcha", "action", "getbalance",
				"version", "v3"),
			want: wantReq{kind: KindSubmit, method: "userrecaptcha", key: testKey, understood: true,
				params: map[string]string{"action": "getbalance"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkReq(t, tc.req, tc.want) })
	}
}

func TestParseKindRouting(t *testing.T) {
	tests := []struct {
		name     string
		path     string
		query    string
		kind     Kind
		endpoint string
	}{
		{"in.php", "/in.php", "method=post", KindSubmit, "in.php"},
		{"in.php with action is a submit", "/in.php", "action=get&id=5", KindSubmit, "in.php"},
		{"res.php get", "/res.php", "action=get&id=5", KindResult, "res.php"},
		{"res.php get without id", "/res.php", "action=get", KindResult, "res.php"},
		{"res.php get with ids", "/res.php", "action=get&ids=5,6", KindMultiResult, "res.php"},
		{"res.php get with id and ids", "/res.php", "action=get&id=5&ids=5,6", KindResult, "res.php"},
		{"res.php getbalance", "/res.php", "action=getbalance", KindBalance, "res.php"},
		{"res.php reportbad", "/res.php", "action=reportbad&id=5", KindReport, "res.php"},
		{"res.php reportgood", "/res.php", "action=reportgood&id=5", KindReport, "res.php"},
		{"res.php get2", "/res.php", "action=get2&id=5", KindOther, "other"},
		{"res.php threadsinfo", "/res.php", "action=threadsinfo", KindOther, "other"},
		{"res.php unknown", "/res.php", "action=nope", KindOther, "other"},
		{"res.php no action", "/res.php", "", KindOther, "other"},
		{"res.php action case sensitive", "/res.php", "action=GET&id=5", KindOther, "other"},
		{"solve.php", "/solve.php", "method=post", KindOther, "other"},
		{"root", "/", "action=get", KindOther, "other"},
		{"empty path", "", "", KindOther, "other"},
		{"favicon", "/favicon.ico", "", KindOther, "other"},
		{"path case sensitive", "/IN.PHP", "method=post", KindOther, "other"},
		{"prefixed in.php", "/captchaai/in.php", "method=post", KindSubmit, "in.php"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Parse(http.MethodGet, tc.path, tc.query, nil, nil)
			if r.Kind != tc.kind {
				t.Errorf("Kind = %v, want %v", r.Kind, tc.kind)
			}
			if got := r.Kind.Endpoint(); got != tc.endpoint {
				t.Errorf("Endpoint = %q, want %q", got, tc.endpoint)
			}
			if !r.Understood {
				t.Error("not understood")
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindOther: "other", KindSubmit: "submit", KindResult: "result",
		KindMultiResult: "multiresult", KindBalance: "balance", KindReport: "report", Kind(42): "kind(42)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
	if FormatText.String() != "text" || FormatJSON.String() != "json" {
		t.Error("Format.String")
	}
}

// TestParseFlags pins the truthiness of json and header_acao. Upstream is
// PHP comparing loosely with 1 (protocol doc §2.1, §9): numeric strings
// equal to 1 are on; "true", "yes", "on", "2" are off (under PHP's plain
// truthiness they would be on; that reading is rejected here because the
// documented value is exactly 1). JSON true becomes "1" and is on.
func TestParseFlags(t *testing.T) {
	tests := []struct {
		value string
		on    bool
	}{
		{"1", true}, {"01", true}, {"1.0", true}, {"+1", true}, {"1e0", true}, {"0.1e1", true},
		{" 1", true}, {"1 ", true}, {"\t1\n", true},
		{"", false}, {"0", false}, {"00", false}, {"0.0", false}, {"-1", false}, {"2", false},
		{"true", false}, {"TRUE", false}, {"yes", false}, {"on", false}, {"json", false},
		{"0x1", false}, {"1_0", false}, {"Inf", false}, {"NaN", false}, {"1e", false}, {".", false},
		{"1a", false}, {"1.", true}, {".1e1", true},
	}
	for _, tc := range tests {
		t.Run("query/"+tc.value, func(t *testing.T) {
			r := getQuery("/in.php", "json", tc.value, "header_acao", tc.value)
			want := FormatText
			if tc.on {
				want = FormatJSON
			}
			if r.Format != want || r.ACAO != tc.on {
				t.Errorf("json=%q: Format %v ACAO %v, want %v %v", tc.value, r.Format, r.ACAO, want, tc.on)
			}
		})
	}
	jsonTests := []struct {
		lit string
		on  bool
	}{
		{`1`, true}, {`1.0`, true}, {`"1"`, true}, {`true`, true},
		{`0`, false}, {`false`, false}, {`null`, false}, {`"true"`, false}, {`2`, false}, {`[1]`, false}, {`{}`, false},
	}
	for _, tc := range jsonTests {
		t.Run("json/"+tc.lit, func(t *testing.T) {
			r := Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
				[]byte(`{"json":`+tc.lit+`,"header_acao":`+tc.lit+`}`))
			if !r.Understood {
				t.Fatal("not understood")
			}
			if (r.Format == FormatJSON) != tc.on || r.ACAO != tc.on {
				t.Errorf("json=%s: Format %v ACAO %v, want on=%v", tc.lit, r.Format, r.ACAO, tc.on)
			}
		})
	}
}

func TestParseNotUnderstood(t *testing.T) {
	good, goodType := multipartBody(t, part{Name: "method", Value: "post"})
	boundary := goodType[strings.Index(goodType, "boundary=")+len("boundary="):]
	tests := []struct {
		name   string
		method string
		query  string
		ctype  string
		body   string
	}{
		{"multipart without boundary", "POST", "", "multipart/form-data", string(good)},
		{"multipart wrong boundary", "POST", "", "multipart/form-data; boundary=nope", string(good)},
		{"multipart truncated", "POST", "", goodType, string(good[:len(good)-10])},
		{"multipart no closing delimiter", "POST", "", goodType,
			"--" + boundary + "\r\nContent-Disposition: form-data; name=\"method\"\r\n\r\npost\r\n"},
		{"multipart bad disposition", "POST", "", goodType,
			"--" + boundary + "\r\nContent-Disposition: form-data; name=\"a b\r\n\r\nx\r\n--" + boundary + "--\r\n"},
		{"multipart attachment disposition", "POST", "", goodType,
			"--" + boundary + "\r\nContent-Disposition: attachment; name=\"key\"\r\n\r\nx\r\n--" + boundary + "--\r\n"},
		{"multipart garbage", "POST", "", goodType, "\x00\xff garbage"},
		{"bad content type syntax", "POST", "", "multipart/form-data; boundary", string(good)},
		{"form with bad escape", "POST", "", formType, "method=post&body=%zz"},
		{"form with semicolon", "POST", "", formType, "method=post;key=x"},
		{"query with bad escape", "GET", "method=post&x=%g0", "", ""},
		{"query with semicolon", "GET", "method=post;key=x", "", ""},
		{"json syntax error", "POST", "", "application/json", `{"method":`},
		{"json trailing garbage", "POST", "", "application/json", `{"method":"post"} x`},
		{"json trailing brace", "POST", "", "application/json", `{"method":"post"}}`},
		{"json two objects", "POST", "", "application/json", `{"a":1}{"b":2}`},
		{"json invalid utf8", "POST", "", "application/json", "{\"body\":\"\xff\xfe\"}"},
		{"json array", "POST", "", "application/json", `[{"method":"post"}]`},
		{"json string", "POST", "", "application/json", `"method"`},
		{"json null", "POST", "", "application/json", `null`},
		{"json bad string escape", "POST", "", "application/json", `{"a":"\x"}`},
		{"text/plain form", "POST", "", "text/plain", "method=post&key=x"},
		{"no content type form", "POST", "", "", "method=post&key=x"},
		{"xml", "POST", "", "application/xml", "<method>post</method>"},
		{"octet-stream", "POST", "", "application/octet-stream", "\x89PNG"},
		{"GET with form body", "GET", "method=post", formType, "key=x"},
		{"PUT with JSON body", "PUT", "", "application/json", `{"key":"x"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Parse(tc.method, "/in.php", tc.query, hdr(tc.ctype), []byte(tc.body))
			if r.Understood {
				t.Errorf("Understood = true, params %q files %d", r.Params, len(r.Files))
			}
			if r.Kind != KindSubmit {
				t.Errorf("Kind = %v, still want routing by path", r.Kind)
			}
			if r.Params == nil {
				t.Error("Params is nil")
			}
			if string(r.Body) != tc.body || r.RawQuery != tc.query || r.HTTPMethod != tc.method {
				t.Error("original request not kept")
			}
			// Neither may panic on a request that was not understood.
			_ = r.Fingerprint()
			if _, err := r.Outgoing(t.Context(), mustURL(t, "https://ocr.captchaai.com")); err != nil {
				t.Errorf("Outgoing: %v", err)
			}
		})
	}
}

func TestParseGETBodyIgnored(t *testing.T) {
	r := Parse(http.MethodGet, "/in.php", "key="+testKey+"&method=post", hdr(formType), []byte("key="+otherKey+"&json=1"))
	if r.Key() != testKey || r.Format != FormatText {
		t.Errorf("a GET body was read: key %q format %v", r.Key(), r.Format)
	}
}

// TestParseMultipartRaw: parts are read raw, as PHP reads them: a
// Content-Transfer-Encoding is not applied.
func TestParseMultipartRaw(t *testing.T) {
	const b = "XyZ"
	body := "--" + b + "\r\n" +
		"Content-Disposition: form-data; name=\"textinstructions\"\r\n" +
		"Content-Transfer-Encoding: quoted-printable\r\n\r\n" +
		"a=3Db=\r\n\r\n" +
		"--" + b + "\r\n" +
		"Content-Disposition: form-data; name=\"file\"; filename=\"c.png\"\r\n" +
		"Content-Type: image/png\r\n" +
		"Content-Transfer-Encoding: quoted-printable\r\n\r\n" +
		"=89PNG\r\n" +
		"--" + b + "\r\n" +
		"Content-Disposition: form-data\r\n\r\n" + // unnamed: ignored
		"ignored\r\n" +
		"--" + b + "--\r\n"
	r := Parse(http.MethodPost, "/in.php", "method=post", hdr("multipart/form-data; boundary="+b), []byte(body))
	checkReq(t, r, wantReq{kind: KindSubmit, method: "post", understood: true,
		params: map[string]string{"textinstructions": "a=3Db=\r\n"},
		files:  []File{{Field: "file", Name: "c.png", Data: []byte("=89PNG")}}})
}

func TestParseRequest(t *testing.T) {
	body := form("key", testKey, "method", "base64", "body", b64(fakeImage(100, 1)))
	t.Run("reads body and query", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodPost, "http://ocr.captchaai.com/in.php?json=1", strings.NewReader(body))
		hr.Header.Set("Content-Type", formType)
		r, err := ParseRequest(hr, int64(len(body)))
		if err != nil {
			t.Fatal(err)
		}
		checkReq(t, r, wantReq{kind: KindSubmit, method: "base64", format: FormatJSON, key: testKey, understood: true})
		if string(r.Body) != body || r.RawQuery != "json=1" || r.Path != "/in.php" || r.HTTPMethod != "POST" {
			t.Error("original request not kept")
		}
	})
	t.Run("GET without body", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodGet, "/res.php?key="+testKey+"&action=get&id=1", nil)
		r, err := ParseRequest(hr, 10)
		if err != nil {
			t.Fatal(err)
		}
		if r.Kind != KindResult || r.Body != nil {
			t.Errorf("Kind %v Body %q", r.Kind, r.Body)
		}
	})
	for _, known := range []bool{true, false} {
		name := "too large with Content-Length"
		if !known {
			name = "too large without Content-Length"
		}
		t.Run(name, func(t *testing.T) {
			hr := httptest.NewRequest(http.MethodPost, "/in.php", strings.NewReader(body))
			hr.Header.Set("Content-Type", formType)
			if !known {
				hr.ContentLength = -1
				hr.Body = io.NopCloser(iotest.OneByteReader(strings.NewReader(body)))
			}
			_, err := ParseRequest(hr, int64(len(body))-1)
			if !errors.Is(err, ErrBodyTooLarge) {
				t.Errorf("err = %v, want ErrBodyTooLarge", err)
			}
		})
	}
	t.Run("lying Content-Length", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodPost, "/in.php", strings.NewReader(body))
		hr.ContentLength = 1
		if _, err := ParseRequest(hr, 10); !errors.Is(err, ErrBodyTooLarge) {
			t.Errorf("err = %v, want ErrBodyTooLarge", err)
		}
	})
	t.Run("exactly the limit", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodPost, "/in.php", strings.NewReader(body))
		hr.ContentLength = -1
		hr.Header.Set("Content-Type", formType)
		r, err := ParseRequest(hr, int64(len(body)))
		if err != nil || string(r.Body) != body {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("no limit", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodPost, "/in.php", strings.NewReader(body))
		hr.ContentLength = -1
		r, err := ParseRequest(hr, math.MaxInt64)
		if err != nil || string(r.Body) != body {
			t.Fatalf("err %v, body %d bytes", err, len(r.Body))
		}
	})
	t.Run("read error", func(t *testing.T) {
		hr := httptest.NewRequest(http.MethodPost, "/in.php", nil)
		boom := errors.New("boom")
		hr.Body = io.NopCloser(iotest.ErrReader(boom))
		hr.ContentLength = -1
		_, err := ParseRequest(hr, 100)
		if !errors.Is(err, boom) || errors.Is(err, ErrBodyTooLarge) {
			t.Errorf("err = %v", err)
		}
	})
}

func TestAccountOf(t *testing.T) {
	a := AccountOf(testKey)
	if a != AccountOf(testKey) {
		t.Error("AccountOf is not stable")
	}
	if a == AccountOf(otherKey) {
		t.Error("two keys share an account")
	}
	if len(a) != 16 || strings.Trim(a, "0123456789abcdef") != "" {
		t.Errorf("AccountOf = %q, want 16 hex digits", a)
	}
	if strings.Contains(a, testKey) || strings.Contains(testKey, a) {
		t.Error("account reveals the key")
	}
	if AccountOf("") != "nokey" {
		t.Errorf("AccountOf(\"\") = %q", AccountOf(""))
	}
	// Pinned: the account name is stored and logged; it must not drift.
	if want := "c3a26866d47a06cb"; a != want {
		t.Errorf("AccountOf(testKey) = %q, want %q", a, want)
	}
	r := getQuery("/in.php", "key", testKey)
	if r.Account() != a {
		t.Error("Request.Account differs from AccountOf")
	}
}
