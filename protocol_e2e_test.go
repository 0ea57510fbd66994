package main

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/solveonce/solveonce/captchaaitest"
)

// Bodies over proxy.max_body get the protocol's own error in the format
// the query asked for, never a truncation or a hang.
func TestOversizedBody(t *testing.T) {
	s := startStack(t, nil)
	big := bytes.Repeat([]byte("A"), 3<<20)
	for _, q := range []string{"", "?json=1"} {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/in.php"+q, bytes.NewReader(big))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r := s.do(t, req)
		require.Equal(t, http.StatusOK, r.Status)
		if q == "" {
			require.Equal(t, "ERROR_TOO_BIG_CAPTCHA_FILESIZE", r.Body)
		} else {
			require.Equal(t, `{"status":0,"request":"ERROR_TOO_BIG_CAPTCHA_FILESIZE"}`, r.Body)
		}
	}
	require.EqualValues(t, 0, s.Fake.SubmitRequests())
}

// A follower asking for JSON gets the task ID with the JSON type upstream
// uses for that method, and header_acao / Content-Type are per client.
func TestFormatsAndHeadersPerClient(t *testing.T) {
	s := startStack(t, nil, captchaaitest.NumericJSONIDs("userrecaptcha"), captchaaitest.ContentTypes("text/html; charset=UTF-8", "application/json; charset=utf-8"))
	// Leader in JSON mode learns the numeric ID type.
	f := tokenForm(keyA, "https://example.com/fmt")
	f.Set("json", "1")
	r1 := s.postForm(t, "/in.php", f, nil)
	require.Regexp(t, `^\{"status":1,"request":\d+\}$`, r1.Body)
	require.Equal(t, "application/json; charset=utf-8", r1.Header.Get("Content-Type"))
	require.Empty(t, r1.Header.Get("Access-Control-Allow-Origin"))

	// An image follower in text then JSON mode, with header_acao.
	v := imageForm(keyA, 42, false)
	v.Set("header_acao", "1")
	r2 := s.postForm(t, "/in.php", v, nil)
	require.Equal(t, "*", r2.Header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "text/html; charset=UTF-8", r2.Header.Get("Content-Type"))
	id := taskID(t, r2)
	v.Set("json", "1")
	v.Del("header_acao")
	r3 := s.postForm(t, "/in.php", v, nil)
	require.Equal(t, `{"status":1,"request":"`+id+`"}`, r3.Body)
	require.Equal(t, "replayed", r3.Outcome)
	require.Empty(t, r3.Header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "application/json; charset=utf-8", r3.Header.Get("Content-Type"))
}

// getbalance, ids= multi-gets, unknown actions and solve.php pass through
// unchanged.
func TestPassThroughActions(t *testing.T) {
	s := startStack(t, nil, captchaaitest.SolveAfterPolls(1))
	r := s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"getbalance"}})
	require.Equal(t, "10.50", r.Body)
	r = s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"getbalance"}, "json": {"1"}})
	require.Equal(t, `{"status":1,"request":"10.50"}`, r.Body)

	id1 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 71, false), nil))
	id2 := taskID(t, s.postForm(t, "/in.php", imageForm(keyA, 72, false), nil))
	r = s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"get"}, "ids": {id1 + "," + id2}})
	parts := strings.Split(r.Body, "|")
	require.Len(t, parts, 2, r.Body)
	require.Equal(t, captchaaitest.ImageAnswer(image(71)), parts[0])

	r = s.get(t, "/res.php", url.Values{"key": {keyA}, "action": {"somethingnew"}})
	require.Equal(t, "ERROR_BAD_PARAMETERS", r.Body)
	require.Equal(t, "miss", r.Outcome)

	// solve.php is not in.php: forwarded unchanged every time (the fake has no
	// solve.php, so both clients see its own 404), never deduplicated.
	before, reqs := s.Fake.Submits(), s.Fake.Requests()
	for range 2 {
		r := s.postForm(t, "/solve.php", imageForm(keyA, 73, false), nil)
		require.Equal(t, http.StatusNotFound, r.Status)
		require.Equal(t, "miss", r.Outcome)
	}
	require.Equal(t, before, s.Fake.Submits(), "solve.php is not an in.php task")
	require.Equal(t, reqs+2, s.Fake.Requests(), "solve.php forwarded every time")
}

// Malformed requests are forwarded unchanged and never deduplicated.
func TestMalformedForwardedNotDeduplicated(t *testing.T) {
	s := startStack(t, nil)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/in.php", strings.NewReader("--x\r\nbroken multipart"))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=x")
		r := s.do(t, req)
		require.Equal(t, http.StatusOK, r.Status)
		require.Equal(t, "miss", r.Outcome)
	}
	require.EqualValues(t, 2, s.Fake.SubmitRequests())
}
