package captchaaitest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	keyA = "0123456789abcdef0123456789abcdef"
	keyB = "fedcba9876543210fedcba9876543210"
)

var (
	idRE    = regexp.MustCompile(`^[0-9]{11}$`)
	tokenRE = regexp.MustCompile(`^TOKEN-[0-9]{11}-[0-9a-f]{16}$`)
	image1  = append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("captcha-one+/"), 20)...)
	image2  = append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("captcha-two?"), 20)...)
)

// fixture is a Server with a client that reaches it.
type fixture struct {
	s *Server
	c *http.Client
}

type mode struct {
	name string
	new  func(t testing.TB, opts ...Option) fixture
}

// modes reach the fake over real HTTP (fresh connection per request, so that
// Go's transport never silently retries a reset request) and in-process.
var modes = []mode{
	{"http", func(t testing.TB, opts ...Option) fixture {
		s := NewServer(t, opts...)
		tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
		t.Cleanup(tr.CloseIdleConnections)
		return fixture{s, &http.Client{Transport: tr}}
	}},
	{"transport", func(t testing.TB, opts ...Option) fixture {
		s := NewInProcess(t, opts...)
		return fixture{s, &http.Client{Transport: s.Transport()}}
	}},
}

func forModes(t *testing.T, f func(t *testing.T, newFixture func(t testing.TB, opts ...Option) fixture)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m.new) })
	}
}

// resp is a response read whole.
type resp struct {
	status int
	header http.Header
	body   string
}

func (f fixture) try(req *http.Request) (resp, error) {
	r, err := f.c.Do(req)
	if err != nil {
		return resp{}, err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{r.StatusCode, r.Header, string(b)}, nil
}

func (f fixture) do(t testing.TB, req *http.Request) resp {
	t.Helper()
	r, err := f.try(req)
	require.NoError(t, err)
	return r
}

// get sends a GET with params in the query.
func (f fixture) get(t testing.TB, endpoint string, params url.Values) resp {
	t.Helper()
	return f.do(t, build(t, f.s.URL, endpoint, encGET, params, nil))
}

// submitOK submits and returns the new task ID.
func (f fixture) submitOK(t testing.TB, params url.Values) string {
	t.Helper()
	r := f.get(t, "in.php", params)
	require.Equal(t, http.StatusOK, r.status)
	require.True(t, strings.HasPrefix(r.body, "OK|"), "body %q", r.body)
	id := strings.TrimPrefix(r.body, "OK|")
	require.Regexp(t, idRE, id)
	return id
}

func (f fixture) poll(t testing.TB, key, id string, extra ...string) resp {
	t.Helper()
	p := url.Values{"key": {key}, "action": {"get"}, "id": {id}}
	for i := 0; i+1 < len(extra); i += 2 {
		p.Set(extra[i], extra[i+1])
	}
	return f.get(t, "res.php", p)
}

func vals(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v
}

func turnstile(key string, extra ...string) url.Values {
	return vals(append([]string{"key", key, "method", "turnstile", "sitekey", "0x4AAAA", "pageurl", "https://example.com/login"}, extra...)...)
}

type encoding int

const (
	encGET encoding = iota
	encForm
	encMultipart
	encQueryPOST
	encJSON
	encJSONNoType
)

var encodings = []struct {
	name string
	enc  encoding
}{
	{"get-query", encGET},
	{"post-urlencoded", encForm},
	{"post-multipart", encMultipart},
	{"post-query-empty-body", encQueryPOST},
	{"post-json", encJSON},
	{"post-json-no-content-type", encJSONNoType},
}

// build makes a request in encoding e; files become multipart file parts
// (encMultipart only).
func build(t testing.TB, base, endpoint string, e encoding, params url.Values, files map[string][]byte) *http.Request {
	t.Helper()
	u := base + "/" + endpoint
	var (
		req *http.Request
		err error
	)
	switch e {
	case encGET:
		req, err = http.NewRequest(http.MethodGet, u+"?"+params.Encode(), http.NoBody)
	case encQueryPOST:
		req, err = http.NewRequest(http.MethodPost, u+"?"+params.Encode(), http.NoBody)
	case encForm:
		req, err = http.NewRequest(http.MethodPost, u, strings.NewReader(params.Encode()))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	case encMultipart:
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		for k, vs := range params {
			for _, v := range vs {
				require.NoError(t, mw.WriteField(k, v))
			}
		}
		for field, data := range files {
			w, err := mw.CreateFormFile(field, "captcha.png")
			require.NoError(t, err)
			_, err = w.Write(data)
			require.NoError(t, err)
		}
		require.NoError(t, mw.Close())
		req, err = http.NewRequest(http.MethodPost, u, &buf)
		if err == nil {
			req.Header.Set("Content-Type", mw.FormDataContentType())
		}
	case encJSON, encJSONNoType:
		m := map[string]any{}
		for k := range params {
			m[k] = params.Get(k)
		}
		if params.Get("json") == "1" {
			m["json"] = 1 // 2captcha-ruby sends a JSON number
		}
		b, err2 := json.Marshal(m)
		require.NoError(t, err2)
		req, err = http.NewRequest(http.MethodPost, u, bytes.NewReader(b))
		if err == nil && e == encJSON {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	require.NoError(t, err)
	return req
}

func TestEveryEncodingCreatesAndPollsATask(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		for _, e := range encodings {
			t.Run(e.name, func(t *testing.T) {
				f := newFixture(t)
				r := f.do(t, build(t, f.s.URL, "in.php", e.enc, turnstile(keyA, "soft_id", "4580"), nil))
				require.Equal(t, http.StatusOK, r.status)
				require.Regexp(t, `^OK\|[0-9]{11}$`, r.body)
				id := strings.TrimPrefix(r.body, "OK|")
				require.EqualValues(t, 1, f.s.Submits())

				task, ok := f.s.Task(id)
				require.True(t, ok)
				require.Equal(t, keyA, task.Key)
				require.Equal(t, "turnstile", task.Method)
				require.Equal(t, "0x4AAAA", task.Params.Get("sitekey"))
				require.Empty(t, task.Params.Get("key"), "the key is not a parameter")

				poll := vals("key", keyA, "action", "get", "id", id)
				r = f.do(t, build(t, f.s.URL, "res.php", e.enc, poll, nil))
				require.Equal(t, "CAPCHA_NOT_READY", r.body)
				r = f.do(t, build(t, f.s.URL, "res.php", e.enc, poll, nil))
				require.Regexp(t, `^OK\|TOKEN-`+id+`-[0-9a-f]{16}$`, r.body)
				require.EqualValues(t, 2, f.s.Polls())

				r = f.do(t, build(t, f.s.URL, "in.php", e.enc, turnstile(keyA, "json", "1"), nil))
				require.Regexp(t, `^\{"status":1,"request":"[0-9]{11}"\}$`, r.body, "json=1 (a JSON number in JSON bodies)")
				require.Equal(t, "application/json", r.header.Get("Content-Type"))
			})
		}
	})
}

func TestMultipartFileAndKeyInBody(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		req := build(t, f.s.URL, "in.php", encMultipart, vals("key", keyA, "method", "post"), map[string][]byte{"file": image1})
		r := f.do(t, req)
		require.Regexp(t, `^OK\|[0-9]{11}$`, r.body)
		task, ok := f.s.Task(strings.TrimPrefix(r.body, "OK|"))
		require.True(t, ok)
		require.Equal(t, image1, task.Image)
		require.Equal(t, ImageAnswer(image1), task.Answer)
	})
}

func TestByteExactAnswers(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, SolveAfterPolls(2), Answerer(func(Task) (string, string) { return "03AGdBq25SxXT-pmSeBXjzScW", "" }))
		id := f.submitOK(t, turnstile(keyA))
		idJSON := strings.TrimPrefix(f.get(t, "in.php", turnstile(keyA)).body, "OK|")
		cases := []struct {
			name     string
			endpoint string
			params   url.Values
			body     string
			ct       string
		}{
			{"submit json", "in.php", turnstile(keyA, "json", "1"), `{"status":1,"request":"%s"}`, "application/json"},
			{"not ready plain", "res.php", vals("key", keyA, "action", "get", "id", id), "CAPCHA_NOT_READY", "text/plain; charset=utf-8"},
			{"solved plain", "res.php", vals("key", keyA, "action", "get", "id", id), "OK|03AGdBq25SxXT-pmSeBXjzScW", "text/plain; charset=utf-8"},
			{"not ready json", "res.php", vals("key", keyA, "action", "get", "id", idJSON, "json", "1"), `{"status":0,"request":"CAPCHA_NOT_READY"}`, "application/json"},
			{"solved json", "res.php", vals("key", keyA, "action", "get", "id", idJSON, "json", "1"), `{"status":1,"request":"03AGdBq25SxXT-pmSeBXjzScW"}`, "application/json"},
			{"bad key plain", "in.php", turnstile("short"), "ERROR_WRONG_USER_KEY", "text/plain; charset=utf-8"},
			{"bad key json", "in.php", turnstile("short", "json", "1"), `{"status":0,"request":"ERROR_WRONG_USER_KEY"}`, "application/json"},
			{"unknown id plain", "res.php", vals("key", keyA, "action", "get", "id", "12345678901"), "ERROR_WRONG_CAPTCHA_ID", "text/plain; charset=utf-8"},
			{"bad id json", "res.php", vals("key", keyA, "action", "get", "id", "12a", "json", "1"), `{"status":0,"request":"ERROR_WRONG_ID_FORMAT"}`, "application/json"},
			{"balance plain", "res.php", vals("key", keyA, "action", "getbalance"), "10.50", "text/plain; charset=utf-8"},
			{"balance json", "res.php", vals("key", keyA, "action", "getbalance", "json", "1"), `{"status":1,"request":"10.50"}`, "application/json"},
			{"empty action", "res.php", vals("key", keyA), "ERROR_EMPTY_ACTION", "text/plain; charset=utf-8"},
			{"unknown action", "res.php", vals("key", keyA, "action", "threadsinfo"), "ERROR_BAD_PARAMETERS", "text/plain; charset=utf-8"},
		}
		for _, c := range cases {
			r := f.get(t, c.endpoint, c.params)
			want := c.body
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, strings.TrimPrefix(strings.TrimPrefix(r.body, `{"status":1,"request":"`), "x"))
				require.Regexp(t, `^\{"status":1,"request":"[0-9]{11}"\}$`, r.body, c.name)
			} else {
				require.Equal(t, want, r.body, c.name)
			}
			require.Equal(t, http.StatusOK, r.status, c.name)
			require.Equal(t, c.ct, r.header.Get("Content-Type"), c.name)
			require.Equal(t, fmt.Sprint(len(r.body)), r.header.Get("Content-Length"), c.name)
			require.Empty(t, r.header.Get("Access-Control-Allow-Origin"), c.name)
		}
	})
}

func TestContentTypesAndErrorText(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, ContentTypes("text/html", "text/html; charset=UTF-8"), ErrorText(true))
		r := f.get(t, "in.php", turnstile("short", "json", "1"))
		require.Equal(t, `{"status":0,"request":"ERROR_WRONG_USER_KEY","error_text":"You've provided key parameter value in incorrect format, it should contain 32 symbols."}`, r.body)
		require.Equal(t, "text/html; charset=UTF-8", r.header.Get("Content-Type"))
		id := f.submitOK(t, turnstile(keyA))
		require.Equal(t, "text/html", f.poll(t, keyA, id).header.Get("Content-Type"))
		id = f.submitOK(t, turnstile(keyA))
		require.Equal(t, `{"status":0,"request":"CAPCHA_NOT_READY"}`, f.poll(t, keyA, id, "json", "1").body, "not ready is no error")
		require.Equal(t, "ERROR_WRONG_USER_KEY", f.get(t, "in.php", turnstile("short")).body, "plain errors carry no text")
	})
}

func TestNumericJSONIDs(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, NumericJSONIDs("userrecaptcha"))
		recaptcha := vals("key", keyA, "method", "userrecaptcha", "googlekey", "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-", "pageurl", "https://example.com/")
		recaptchaJSON := vals("key", keyA, "method", "userrecaptcha", "googlekey", "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-", "pageurl", "https://example.com/", "json", "1")
		cases := []struct {
			name   string
			params url.Values
			re     string
		}{
			{"userrecaptcha json", recaptchaJSON, `^\{"status":1,"request":[0-9]{11}\}$`},
			{"userrecaptcha plain", recaptcha, `^OK\|[0-9]{11}$`},
			{"turnstile json", turnstile(keyA, "json", "1"), `^\{"status":1,"request":"[0-9]{11}"\}$`},
		}
		for _, c := range cases {
			require.Regexp(t, c.re, f.get(t, "in.php", c.params).body, c.name)
		}
	})
}

func TestSolveAfterPolls(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			f := modes[1].new(t, SolveAfterPolls(n))
			id := f.submitOK(t, turnstile(keyA))
			task, _ := f.s.Task(id)
			require.Equal(t, n == 0, task.Ready)
			for i := 1; i < n; i++ {
				require.Equal(t, "CAPCHA_NOT_READY", f.poll(t, keyA, id).body, "poll %d", i)
			}
			want := "OK|" + task.Answer
			require.Equal(t, want, f.poll(t, keyA, id).body)
			require.Equal(t, want, f.poll(t, keyA, id).body, "stays solved")
			task, _ = f.s.Task(id)
			require.True(t, task.Ready)
			require.Equal(t, max(n, 1)+1, task.Polls)
		})
	}
}

func TestAnswers(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, SolveAfterPolls(1))
		b64 := base64.StdEncoding.EncodeToString(image1)
		submits := []struct {
			name string
			req  *http.Request
			img  []byte
		}{
			{"multipart file", build(t, f.s.URL, "in.php", encMultipart, vals("key", keyA, "method", "post"), map[string][]byte{"file": image1}), image1},
			{"base64 urlencoded", build(t, f.s.URL, "in.php", encForm, vals("key", keyA, "method", "base64", "body", b64), nil), image1},
			{"base64 data uri json", build(t, f.s.URL, "in.php", encJSON, vals("key", keyB, "method", "base64", "body", "data:image/png;base64,"+b64), nil), image1},
			{"base64 multipart field", build(t, f.s.URL, "in.php", encMultipart, vals("key", keyA, "method", "base64", "body", b64), nil), image1},
			{"other image", build(t, f.s.URL, "in.php", encForm, vals("key", keyA, "method", "base64", "body", base64.StdEncoding.EncodeToString(image2)), nil), image2},
		}
		for _, sub := range submits {
			r := f.do(t, sub.req)
			require.Regexp(t, `^OK\|[0-9]{11}$`, r.body, sub.name)
			id := strings.TrimPrefix(r.body, "OK|")
			task, ok := f.s.Task(id)
			require.True(t, ok)
			require.Equal(t, "OK|"+ImageAnswer(sub.img), f.poll(t, task.Key, id).body, sub.name)
		}
		require.NotEqual(t, ImageAnswer(image1), ImageAnswer(image2))
		require.Regexp(t, `^ANS[0-9a-f]{10}$`, ImageAnswer(image1))

		tokens := map[string]bool{}
		for range 5 {
			id := f.submitOK(t, turnstile(keyA))
			r := f.poll(t, keyA, id)
			tok := strings.TrimPrefix(r.body, "OK|")
			require.Regexp(t, tokenRE, tok)
			require.True(t, strings.HasPrefix(tok, "TOKEN-"+id+"-"))
			require.False(t, tokens[tok], "token reused")
			tokens[tok] = true
		}
	})
}

func TestAnswererAndUnsolvable(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, SolveAfterPolls(1), ErrorText(true), Answerer(func(task Task) (string, string) {
			if task.Params.Get("sitekey") == "dead" {
				return "", "ERROR_CAPTCHA_UNSOLVABLE"
			}
			return "answer-for-" + task.Method, ""
		}))
		id := f.submitOK(t, turnstile(keyA))
		require.Equal(t, "OK|answer-for-turnstile", f.poll(t, keyA, id).body)
		dead := f.submitOK(t, vals("key", keyA, "method", "turnstile", "sitekey", "dead"))
		require.Equal(t, "ERROR_CAPTCHA_UNSOLVABLE", f.poll(t, keyA, dead).body)
		require.Equal(t, `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE","error_text":"We are unable to solve your captcha."}`, f.poll(t, keyA, dead, "json", "1").body)
	})
}

func TestKeyIsolation(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, SolveAfterPolls(1))
		id := f.submitOK(t, turnstile(keyA))
		require.Equal(t, "ERROR_WRONG_CAPTCHA_ID", f.poll(t, keyB, id).body)
		require.Equal(t, `{"status":0,"request":"ERROR_WRONG_CAPTCHA_ID"}`, f.poll(t, keyB, id, "json", "1").body)
		require.Equal(t, "ERROR_WRONG_CAPTCHA_ID", f.get(t, "res.php", vals("key", keyB, "action", "get", "ids", id)).body)
		task, _ := f.s.Task(id)
		require.Zero(t, task.Polls, "another key's polls do not advance the task")
		require.True(t, strings.HasPrefix(f.poll(t, keyA, id).body, "OK|TOKEN-"))
	})
}

func TestInvalidKeys(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		for _, key := range []string{"", "short", strings.ToUpper(keyA), keyA + "0", keyA[:31], strings.Repeat("-", 32)} {
			require.Equal(t, "ERROR_WRONG_USER_KEY", f.get(t, "in.php", turnstile(key)).body, "in.php key %q", key)
			require.Equal(t, "ERROR_WRONG_USER_KEY", f.get(t, "res.php", vals("key", key, "action", "getbalance")).body, "res.php key %q", key)
			require.Equal(t, "ERROR_WRONG_USER_KEY", f.poll(t, key, "12345678901").body, "res.php get key %q", key)
		}
		require.Zero(t, f.s.Submits())
		require.EqualValues(t, 6, f.s.SubmitRequests())

		v := newFixture(t, ValidKeys("test", keyB))
		require.Equal(t, "ERROR_WRONG_USER_KEY", v.get(t, "in.php", turnstile(keyA)).body, "well-formed but not listed")
		v.submitOK(t, turnstile("test"))
		v.submitOK(t, turnstile(keyB))
	})
}

func TestSubmitValidation(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		cases := []struct {
			name   string
			params url.Values
			code   string
		}{
			{"no method", vals("key", keyA), "ERROR_BAD_PARAMETERS"},
			{"post without file", vals("key", keyA, "method", "post"), "ERROR_ZERO_CAPTCHA_FILESIZE"},
			{"base64 empty", vals("key", keyA, "method", "base64", "body", ""), "ERROR_ZERO_CAPTCHA_FILESIZE"},
			{"base64 garbage", vals("key", keyA, "method", "base64", "body", "!!!"), "ERROR_UPLOAD"},
			{"recaptcha no googlekey", vals("key", keyA, "method", "userrecaptcha", "pageurl", "https://a/"), "ERROR_WRONG_GOOGLEKEY"},
			{"recaptcha no pageurl", vals("key", keyA, "method", "userrecaptcha", "googlekey", "k"), "ERROR_PAGEURL"},
			{"turnstile no sitekey", vals("key", keyA, "method", "turnstile", "pageurl", "https://a/"), "ERROR_BAD_PARAMETERS"},
			{"hcaptcha no sitekey", vals("key", keyA, "method", "hcaptcha", "pageurl", "https://a/"), "ERROR_BAD_PARAMETERS"},
		}
		for _, c := range cases {
			require.Equal(t, c.code, f.get(t, "in.php", c.params).body, c.name)
		}
		require.Zero(t, f.s.Submits())
		f.submitOK(t, vals("key", keyA, "method", "geetest", "gt", "g", "challenge", "c"))
		r := f.do(t, build(t, f.s.URL, "in.php", encMultipart, vals("key", keyA), map[string][]byte{"file": image1}))
		require.Regexp(t, `^OK\|`, r.body, "a file without method is an image")
		require.EqualValues(t, 2, f.s.Submits())
		require.Equal(t, http.StatusNotFound, f.get(t, "solve.php", vals("key", keyA)).status)
	})
}

func TestBulkPoll(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, SolveAfterPolls(2))
		ready := f.submitOK(t, turnstile(keyA))
		pending := f.submitOK(t, turnstile(keyA))
		other := f.submitOK(t, turnstile(keyB))
		f.poll(t, keyA, ready)
		f.poll(t, keyA, ready)
		answer, _ := f.s.Task(ready)
		ids := strings.Join([]string{ready, pending, "12345678901", other, "x1"}, ",")

		r := f.get(t, "res.php", vals("key", keyA, "action", "get", "ids", ids))
		want := answer.Answer + "|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_CAPTCHA_ID|ERROR_WRONG_ID_FORMAT"
		require.Equal(t, want, r.body)
		task, _ := f.s.Task(pending)
		require.Equal(t, 1, task.Polls, "a bulk poll is a poll of each task")

		r = f.get(t, "res.php", vals("key", keyA, "action", "get", "ids", ready+","+pending, "json", "1"))
		require.Equal(t, `{"status":1,"request":"`+answer.Answer+"|"+task.Answer+`"}`, r.body)
		require.EqualValues(t, 4, f.s.Polls())
		require.EqualValues(t, 4, f.s.PollsFor(ready))
		require.EqualValues(t, 1, f.s.PollsFor(other), "PollsFor counts requests naming the task, by any key")
	})
}

func TestReportsAndACAO(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		id := f.submitOK(t, turnstile(keyA))
		for _, action := range []string{"reportbad", "reportgood"} {
			for _, js := range []string{"0", "1"} {
				r := f.get(t, "res.php", vals("key", keyA, "action", action, "id", id, "json", js))
				require.Equal(t, http.StatusOK, r.status)
				require.Empty(t, r.body)
				require.Equal(t, "0", r.header.Get("Content-Length"))
			}
		}
		require.EqualValues(t, 4, f.s.Reports())
		task, _ := f.s.Task(id)
		require.Equal(t, 4, task.Reports)

		for _, c := range []struct {
			endpoint string
			params   url.Values
		}{
			{"in.php", turnstile(keyA, "header_acao", "1")},
			{"in.php", turnstile("bad", "header_acao", "1", "json", "1")},
			{"res.php", vals("key", keyA, "action", "get", "id", id, "header_acao", "1")},
			{"res.php", vals("key", keyA, "action", "getbalance", "header_acao", "1", "json", "1")},
		} {
			r := f.get(t, c.endpoint, c.params)
			require.Equal(t, "*", r.header.Get("Access-Control-Allow-Origin"), "%s %v", c.endpoint, c.params)
		}
		require.Empty(t, f.get(t, "res.php", vals("key", keyA, "action", "getbalance", "header_acao", "0")).header.Get("Access-Control-Allow-Origin"))
	})
}

func TestThreads(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t, Threads(2), SolveAfterPolls(1))
		a1 := f.submitOK(t, turnstile(keyA))
		f.submitOK(t, turnstile(keyA))
		require.Equal(t, "ERROR_NO_SLOT_AVAILABLE", f.get(t, "in.php", turnstile(keyA)).body)
		f.submitOK(t, turnstile(keyB))
		f.poll(t, keyA, a1)
		f.submitOK(t, turnstile(keyA))
		require.EqualValues(t, 4, f.s.Submits())
	})
}

func TestRetain(t *testing.T) {
	f := modes[1].new(t, Retain(2))
	first := f.submitOK(t, turnstile(keyA))
	f.submitOK(t, turnstile(keyA))
	last := f.submitOK(t, turnstile(keyA))
	require.Equal(t, "ERROR_WRONG_CAPTCHA_ID", f.poll(t, keyA, first).body)
	require.Equal(t, "CAPCHA_NOT_READY", f.poll(t, keyA, last).body)
	require.Len(t, f.s.Tasks(), 2)
}

func TestCounters(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		id := f.submitOK(t, turnstile(keyA))
		f.submitOK(t, turnstile(keyA, "json", "0", "soft_id", "1")) // same task for the fingerprint
		f.submitOK(t, turnstile(keyA, "action", "login"))
		f.get(t, "in.php", turnstile("bad"))
		f.poll(t, keyA, id)
		f.poll(t, keyA, id)
		f.get(t, "res.php", vals("key", keyA, "action", "getbalance"))
		f.get(t, "res.php", vals("key", keyA, "action", "reportgood", "id", id))

		require.EqualValues(t, 3, f.s.Submits())
		require.EqualValues(t, 4, f.s.SubmitRequests())
		require.EqualValues(t, 2, f.s.Polls())
		require.EqualValues(t, 1, f.s.Reports())
		require.EqualValues(t, 8, f.s.Requests())
		require.EqualValues(t, 2, f.s.PollsFor(id))
		require.Zero(t, f.s.PollsFor("12345678901"))

		tasks := f.s.Tasks()
		require.Len(t, tasks, 3)
		require.Equal(t, id, tasks[0].ID, "oldest first")
		require.Equal(t, tasks[0].Fingerprint, tasks[1].Fingerprint)
		require.NotEqual(t, tasks[0].Fingerprint, tasks[2].Fingerprint)
		require.EqualValues(t, 2, f.s.SubmitsFor(tasks[0].Fingerprint))
		require.EqualValues(t, 1, f.s.SubmitsFor(tasks[2].Fingerprint))
		require.Zero(t, f.s.SubmitsFor("nope"))
		_, ok := f.s.Task("1")
		require.False(t, ok)

		tasks[0].Params.Set("sitekey", "changed")
		again, _ := f.s.Task(id)
		require.Equal(t, "0x4AAAA", again.Params.Get("sitekey"), "snapshots are copies")
	})
}

// outcome is what a client observed.
type outcome int

const (
	outAnswer  outcome = iota // the normal protocol answer
	outCode                   // a protocol code with 200
	outHTML500                // HTML page, 500
	outHTML502                // HTML page, 502
	outReset                  // connection reset
	outTimeout                // hang until the client's deadline
)

var faultCases = []struct {
	fault   Fault
	out     outcome
	code    string
	creates bool // on in.php: task created; on res.php: poll processed
}{
	{FaultNone, outAnswer, "", true},
	{FaultNoSlot, outCode, "ERROR_NO_SLOT_AVAILABLE", false},
	{FaultServerError, outCode, "ERROR_SERVER_ERROR", false},
	{FaultHTML500, outHTML500, "", true},
	{FaultHTML502, outHTML502, "", false},
	{FaultReset, outReset, "", false},
	{FaultResetAfter, outReset, "", true},
	{FaultTimeout, outTimeout, "", true},
}

// checkOutcome sends req (with a short deadline) and checks it ended as
// want.
func checkOutcome(t *testing.T, f fixture, req *http.Request, want outcome, code string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(req.Context(), 300*time.Millisecond)
	defer cancel()
	r, err := f.try(req.WithContext(ctx))
	switch want {
	case outAnswer:
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status)
		require.Regexp(t, `^OK\||^CAPCHA_NOT_READY$`, r.body)
	case outCode:
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, code, r.body)
	case outHTML500, outHTML502:
		require.NoError(t, err)
		status := map[outcome]int{outHTML500: 500, outHTML502: 502}[want]
		require.Equal(t, status, r.status)
		require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
		require.Contains(t, r.body, fmt.Sprintf("<h1>%d %s</h1>", status, http.StatusText(status)))
	case outReset:
		require.Error(t, err)
		require.ErrorIs(t, err, syscall.ECONNRESET)
	case outTimeout:
		require.Error(t, err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
}

func TestFaultsOnSubmit(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		for _, c := range faultCases {
			t.Run(c.fault.String(), func(t *testing.T) {
				f := newFixture(t)
				f.s.FailNext("in.php", 1, c.fault)
				checkOutcome(t, f, build(t, f.s.URL, "in.php", encForm, turnstile(keyA), nil), c.out, c.code)
				created := int64(0)
				if c.creates {
					created = 1
				}
				require.Equal(t, created, f.s.Submits(), "task created")
				require.Len(t, f.s.Tasks(), int(created))
				require.EqualValues(t, 1, f.s.SubmitRequests())
				// The fault is used up: the next submit is answered.
				f.submitOK(t, turnstile(keyA))
			})
		}
	})
}

func TestFaultsOnPoll(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		for _, c := range faultCases {
			t.Run(c.fault.String(), func(t *testing.T) {
				f := newFixture(t, SolveAfterPolls(5))
				id := f.submitOK(t, turnstile(keyA))
				f.s.FailNext("res.php", 1, c.fault)
				req := build(t, f.s.URL, "res.php", encGET, vals("key", keyA, "action", "get", "id", id), nil)
				checkOutcome(t, f, req, c.out, c.code)
				task, _ := f.s.Task(id)
				processed := 0
				if c.creates {
					processed = 1
				}
				require.Equal(t, processed, task.Polls, "poll processed")
				require.EqualValues(t, 1, f.s.Polls())
				require.EqualValues(t, 1, f.s.PollsFor(id))
				require.EqualValues(t, 1, f.s.Submits(), "in.php is not affected")
			})
		}
	})
}

func TestTransportErrors(t *testing.T) {
	f := modes[1].new(t)
	f.s.FailNext("in.php", 1, FaultReset)
	_, err := f.c.Get(f.s.URL + "/in.php?" + turnstile(keyA).Encode())
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	require.Equal(t, "read", op.Op)
	require.ErrorIs(t, err, syscall.ECONNRESET)

	f.s.SetOutage(true)
	_, err = f.c.Get(f.s.URL + "/in.php?" + turnstile(keyA).Encode())
	require.ErrorAs(t, err, &op)
	require.Equal(t, "dial", op.Op)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Zero(t, f.s.Submits())
	require.EqualValues(t, 1, f.s.SubmitRequests(), "the reset request reached the handler, the refused one did not")
	require.EqualValues(t, 1, f.s.Refused())
	require.EqualValues(t, 2, f.s.Requests())
	f.s.SetOutage(false)
	f.submitOK(t, turnstile(keyA))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := build(t, f.s.URL, "in.php", encGET, turnstile(keyA), nil).WithContext(ctx)
	_, err = f.c.Do(req)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 1, f.s.Submits(), "a cancelled request reaches nothing")
}

func TestOutage(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		id := f.submitOK(t, turnstile(keyA))
		f.s.SetOutage(true)
		for _, req := range []*http.Request{
			build(t, f.s.URL, "in.php", encForm, turnstile(keyA), nil),
			build(t, f.s.URL, "res.php", encGET, vals("key", keyA, "action", "get", "id", id), nil),
		} {
			_, err := f.try(req)
			require.Error(t, err)
			require.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED), "err %v", err)
		}
		require.EqualValues(t, 1, f.s.Submits())
		require.Zero(t, f.s.Polls())
		require.EqualValues(t, 2, f.s.Refused())
		f.s.SetOutage(false)
		require.Equal(t, "CAPCHA_NOT_READY", f.poll(t, keyA, id).body)
	})
}

func TestFailCodeAndQueue(t *testing.T) {
	forModes(t, func(t *testing.T, newFixture func(testing.TB, ...Option) fixture) {
		f := newFixture(t)
		f.s.FailCode("in.php", 2, "MAX_USER_TURN")
		f.s.FailNext("in.php", 1, FaultNoSlot)
		require.Equal(t, "MAX_USER_TURN", f.get(t, "in.php", turnstile(keyA)).body)
		require.Equal(t, `{"status":0,"request":"MAX_USER_TURN"}`, f.get(t, "in.php", turnstile(keyA, "json", "1")).body)
		require.Equal(t, "ERROR_NO_SLOT_AVAILABLE", f.get(t, "in.php", turnstile(keyA)).body)
		id := f.submitOK(t, turnstile(keyA))
		require.EqualValues(t, 1, f.s.Submits())

		f.s.FailCode("res.php", 1, "ERROR_SERVER_ERROR")
		require.Equal(t, "ERROR_SERVER_ERROR", f.poll(t, keyA, id).body)
		task, _ := f.s.Task(id)
		require.Zero(t, task.Polls)

		f.s.FailNext("in.php", 5, FaultNoSlot)
		f.s.FailNext("in.php", 0, FaultNone) // clears
		f.submitOK(t, turnstile(keyA))

		f.s.FailNext("res.php", 1, FaultNoSlot)
		require.Equal(t, "ERROR_WRONG_USER_KEY", f.poll(t, "bad", id).body, "the key check comes before faults")
		require.Equal(t, "ERROR_NO_SLOT_AVAILABLE", f.poll(t, keyA, id).body)
		require.Panics(t, func() { f.s.FailNext("solve.php", 1, FaultNoSlot) })
	})
}

func TestFailRatioDeterministic(t *testing.T) {
	pattern := func(s *Server, c *http.Client, n int) string {
		var b strings.Builder
		for range n {
			r, err := c.Get(s.URL + "/in.php?" + turnstile(keyA).Encode())
			require.NoError(t, err)
			body, err := io.ReadAll(r.Body)
			require.NoError(t, err)
			require.NoError(t, r.Body.Close())
			if string(body) == "ERROR_NO_SLOT_AVAILABLE" {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	const n = 200
	a := modes[1].new(t, Seed(7))
	b := modes[1].new(t, Seed(7))
	c := modes[1].new(t, Seed(8))
	for _, f := range []fixture{a, b, c} {
		f.s.FailRatio("in.php", 0.3, FaultNoSlot)
	}
	pa, pb, pc := pattern(a.s, a.c, n), pattern(b.s, b.c, n), pattern(c.s, c.c, n)
	require.Equal(t, pa, pb, "same seed, same faults")
	require.NotEqual(t, pa, pc, "another seed, other faults")
	failed := strings.Count(pa, "x")
	require.InDelta(t, 0.3*n, failed, 0.1*n)
	require.EqualValues(t, n-failed, a.s.Submits())

	a.s.FailRatio("in.php", 0.3, FaultNoSlot)
	require.Equal(t, pa, pattern(a.s, a.c, n), "FailRatio reseeds")
	a.s.FailRatio("in.php", 0, FaultNoSlot)
	require.Equal(t, strings.Repeat(".", 20), pattern(a.s, a.c, 20))
}

func TestParseFault(t *testing.T) {
	for _, c := range faultCases {
		got, err := ParseFault(strings.ToUpper(c.fault.String()))
		require.NoError(t, err)
		require.Equal(t, c.fault, got)
	}
	got, err := ParseFault("reset-after")
	require.NoError(t, err)
	require.Equal(t, FaultResetAfter, got)
	_, err = ParseFault("explode")
	require.Error(t, err)
	require.Equal(t, "fault(99)", Fault(99).String())
}

// receiver is a loopback pingback receiver.
func receiver(t *testing.T) (*httptest.Server, chan url.Values) {
	got := make(chan url.Values, 16)
	rs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.Query()
	}))
	t.Cleanup(rs.Close)
	return rs, got
}

func waitPingback(t *testing.T, got chan url.Values) url.Values {
	t.Helper()
	select {
	case q := <-got:
		return q
	case <-time.After(5 * time.Second):
		t.Fatal("no pingback within 5s")
		return nil
	}
}

func TestPingback(t *testing.T) {
	t.Run("on poll", func(t *testing.T) {
		rs, got := receiver(t)
		f := modes[0].new(t, SolveAfterPolls(2))
		id := f.submitOK(t, turnstile(keyA, "pingback", rs.URL+"/cb?src=fake"))
		f.poll(t, keyA, id)
		require.Zero(t, f.s.Pingbacks())
		f.poll(t, keyA, id)
		f.poll(t, keyA, id)
		q := waitPingback(t, got)
		task, _ := f.s.Task(id)
		require.Equal(t, url.Values{"src": {"fake"}, "id": {id}, "code": {task.Answer}}, q)
		f.s.Close() // waits for deliveries
		require.Empty(t, got, "delivered once")
		require.EqualValues(t, 1, f.s.Pingbacks())
	})
	t.Run("at once", func(t *testing.T) {
		rs, got := receiver(t)
		f := modes[1].new(t, SolveAfterPolls(0), Answerer(func(Task) (string, string) { return "", "ERROR_CAPTCHA_UNSOLVABLE" }))
		id := f.submitOK(t, turnstile(keyA, "pingback", rs.URL))
		q := waitPingback(t, got)
		require.Equal(t, id, q.Get("id"))
		require.Equal(t, "ERROR_CAPTCHA_UNSOLVABLE", q.Get("code"))
	})
	t.Run("timer", func(t *testing.T) {
		rs, got := receiver(t)
		f := modes[0].new(t, SolveAfter(50*time.Millisecond))
		id := f.submitOK(t, turnstile(keyA, "pingback", rs.URL))
		q := waitPingback(t, got)
		require.Equal(t, id, q.Get("id"))
		task, _ := f.s.Task(id)
		require.True(t, task.Ready)
		require.Equal(t, "OK|"+task.Answer, f.poll(t, keyA, id).body)
		f.s.Close()
		require.Empty(t, got)
	})
	t.Run("not loopback", func(t *testing.T) {
		f := modes[1].new(t, SolveAfterPolls(0))
		for _, u := range []string{"http://example.com/cb", "http://10.0.0.1/cb", "ftp://127.0.0.1/cb", "::bad"} {
			f.submitOK(t, turnstile(keyA, "pingback", u))
		}
		require.Zero(t, f.s.Pingbacks())
	})
}

func TestHandlerWithRecorder(t *testing.T) {
	s := NewInProcess(t)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/res.php?"+vals("key", keyA, "action", "getbalance").Encode(), nil))
	require.Equal(t, "10.50", rec.Body.String())
	s.FailNext("res.php", 1, FaultReset)
	require.PanicsWithValue(t, http.ErrAbortHandler, func() {
		s.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/res.php?"+vals("key", keyA, "action", "getbalance").Encode(), nil))
	})
}

func TestCloseStopsEverything(t *testing.T) {
	base := runtime.NumGoroutine()
	rs, _ := receiver(t)
	s, err := Start("", SolveAfter(time.Hour), Latency(0))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(s.URL, "http://127.0.0.1:"))
	tr := &http.Transport{Proxy: nil}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	r, err := c.Get(s.URL + "/in.php?" + turnstile(keyA, "pingback", rs.URL).Encode())
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, r.Body)
	require.NoError(t, r.Body.Close())

	s.FailNext("in.php", 1, FaultTimeout)
	s.SetLatency(time.Hour)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			r, err := c.Get(s.URL + "/in.php?" + turnstile(keyA).Encode())
			if err == nil {
				r.Body.Close()
			}
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return s.SubmitRequests() == 3 }, 5*time.Second, time.Millisecond)

	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for range 2 {
		select {
		case err := <-errs:
			require.Error(t, err, "hanging requests fail when the server closes")
		case <-time.After(5 * time.Second):
			t.Fatal("request still hanging after Close")
		}
	}
	_, err = c.Get(s.URL + "/res.php?" + vals("key", keyA, "action", "getbalance").Encode())
	require.Error(t, err, "nothing listens after Close")
	_, err = s.Transport().RoundTrip(build(t, s.URL, "res.php", encGET, vals("key", keyA, "action", "getbalance"), nil))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Zero(t, s.Pingbacks(), "the timer was stopped")
	s.Close() // idempotent

	tr.CloseIdleConnections()
	rs.Close()
	requireGoroutinesAtMost(t, base)
}

// requireGoroutinesAtMost waits, boundedly, until at most n goroutines run.
func requireGoroutinesAtMost(t *testing.T, n int) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range 500 {
		if runtime.NumGoroutine() <= n {
			return
		}
		<-tick.C
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("%d goroutines running, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
}

func TestSynctest(t *testing.T) {
	t.Run("SolveAfter", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := fixture{}
			f.s = NewInProcess(t, SolveAfter(30*time.Second))
			f.c = &http.Client{Transport: f.s.Transport()}
			id := f.submitOK(t, turnstile(keyA))
			start := time.Now()
			time.Sleep(30*time.Second - time.Nanosecond)
			require.Equal(t, "CAPCHA_NOT_READY", f.poll(t, keyA, id).body)
			time.Sleep(time.Nanosecond)
			require.Equal(t, 30*time.Second, time.Since(start))
			require.Regexp(t, `^OK\|TOKEN-`, f.poll(t, keyA, id).body)
		})
	})
	t.Run("Latency and Timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := fixture{}
			f.s = NewInProcess(t, Latency(10*time.Second))
			f.c = &http.Client{Transport: f.s.Transport()}
			start := time.Now()
			f.submitOK(t, turnstile(keyA))
			require.Equal(t, 10*time.Second, time.Since(start))

			f.s.SetLatency(0)
			f.s.FailNext("in.php", 1, FaultTimeout)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start = time.Now()
			_, err := f.try(build(t, f.s.URL, "in.php", encGET, turnstile(keyA), nil).WithContext(ctx))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Equal(t, time.Minute, time.Since(start))
			require.EqualValues(t, 2, f.s.Submits(), "a hanging submit created its task")
		})
	})
}
