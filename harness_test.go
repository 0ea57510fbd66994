package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/config"
)

// stack is solveonce, built by the same code as `go run .`, in front of a
// fake CaptchaAI, on loopback.
type stack struct {
	URL  string // base URL of solveonce
	Fake *captchaaitest.Server
	App  *app
	http *http.Client
}

// startStack starts a fake CaptchaAI with fakeOpts and solveonce in front of
// it; mutate may change the configuration first.
func startStack(t *testing.T, mutate func(*config.File), fakeOpts ...captchaaitest.Option) *stack {
	t.Helper()
	fake := captchaaitest.NewServer(t, fakeOpts...)
	cfg := config.Default()
	cfg.Upstream.BaseURL = fake.URL
	cfg.Proxy.Listen = "127.0.0.1:0"
	cfg.Admin.Listen = "off"
	cfg.DataDir = t.TempDir()
	cfg.Cache.PendingTTL = 100 * time.Millisecond // tests poll fast; the poll-storm test sets its own
	if mutate != nil {
		mutate(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := build(cfg, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serveApp(t, a)
	tr := &http.Transport{MaxIdleConnsPerHost: 256, Proxy: nil}
	t.Cleanup(tr.CloseIdleConnections)
	return &stack{URL: base, Fake: fake, App: a, http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// serveApp serves a on a loopback port exactly as `go run .` does (serve
// with graceful shutdown). stop, also registered as a cleanup, shuts it
// down, checks it stopped cleanly and closes it; it is safe to call twice.
func serveApp(t testing.TB, a *app) (base string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.serve(ctx, ln, io.Discard) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve: %v", err)
				}
			case <-time.After(40 * time.Second):
				t.Error("solveonce did not shut down")
			}
			a.close()
		})
	}
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

// Test API keys: 32 lower-case hex characters, as CaptchaAI issues them.
const (
	keyA = "0123456789abcdef0123456789abcdef"
	keyB = "fedcba9876543210fedcba9876543210"
)

// resp is one answer as a client saw it.
type resp struct {
	Status  int
	Body    string
	Header  http.Header
	Outcome string
}

func (s *stack) do(t testing.TB, req *http.Request) resp {
	t.Helper()
	r, err := s.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{Status: r.StatusCode, Body: string(b), Header: r.Header, Outcome: r.Header.Get("X-Solveonce")}
}

// get sends GET path?params.
func (s *stack) get(t testing.TB, path string, params url.Values) resp {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.URL+path+"?"+params.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.do(t, req)
}

// postForm sends an urlencoded POST.
func (s *stack) postForm(t testing.TB, path string, params url.Values, header http.Header) resp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(params.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return s.do(t, req)
}

// postFile sends a multipart method=post upload of img.
func (s *stack) postFile(t testing.TB, key string, img []byte, extra url.Values) resp {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.WriteField("key", key)
	_ = mw.WriteField("method", "post")
	for k, vs := range extra {
		for _, v := range vs {
			_ = mw.WriteField(k, v)
		}
	}
	fw, _ := mw.CreateFormFile("file", "captcha.png")
	_, _ = fw.Write(img)
	_ = mw.Close()
	req, err := http.NewRequest(http.MethodPost, s.URL+"/in.php", &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	return s.do(t, req)
}

// image returns a deterministic fake picture for n.
func image(n int) []byte {
	return []byte(fmt.Sprintf("\x89PNG\r\n\x1a\n fake image number %d %s", n, strings.Repeat("x", 200)))
}

func imageForm(key string, n int, json bool) url.Values {
	v := url.Values{"key": {key}, "method": {"base64"}, "body": {base64.StdEncoding.EncodeToString(image(n))}}
	if json {
		v.Set("json", "1")
	}
	return v
}

func tokenForm(key, pageurl string) url.Values {
	return url.Values{"key": {key}, "method": {"userrecaptcha"}, "googlekey": {"6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"}, "pageurl": {pageurl}}
}

// taskID extracts the task ID of an in.php answer in either format.
func taskID(t testing.TB, r resp) string {
	t.Helper()
	if strings.HasPrefix(r.Body, "OK|") {
		return r.Body[3:]
	}
	var j struct {
		Status  int             `json:"status"`
		Request json.RawMessage `json:"request"`
	}
	if err := json.Unmarshal([]byte(r.Body), &j); err != nil || j.Status != 1 {
		t.Fatalf("not a task answer: %q (%d)", r.Body, r.Status)
	}
	return strings.Trim(string(j.Request), `"`)
}

// pollUntilDone polls res.php until the answer is not CAPCHA_NOT_READY.
func (s *stack) pollUntilDone(t testing.TB, key, id string) resp {
	t.Helper()
	for range 200 {
		r := s.get(t, "/res.php", url.Values{"key": {key}, "action": {"get"}, "id": {id}})
		if r.Body != "CAPCHA_NOT_READY" {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("task %s never finished", id)
	return resp{}
}

// layerCircuitState reports the upstream circuit's state.
func (a *app) layerCircuitState() string { return a.up.Circuit().State().String() }
