package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// Proxy authentication: none or wrong credentials get 407 with a
// challenge, on CONNECT and plain requests; right ones pass. Base-URL mode
// needs none.
func TestProxyAuth(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "origin") }))
	t.Cleanup(origin.Close)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.AuthUser = "scraper"; c.AuthPassword = "s3cret:pw" }})
	for name, user := range map[string]*url.Userinfo{
		"none":           nil,
		"wrong password": url.UserPassword("scraper", "nope"),
		"wrong user":     url.UserPassword("other", "s3cret:pw"),
	} {
		t.Run(name, func(t *testing.T) {
			h := http.Header{}
			if user != nil {
				req := &http.Request{Header: http.Header{}}
				pw, _ := user.Password()
				req.SetBasicAuth(user.Username(), pw)
				h.Set("Proxy-Authorization", req.Header.Get("Authorization"))
			}
			resp, _, _ := rawConnect(t, s.Addr, "ocr.captchaai.com:443", h, nil)
			if resp.StatusCode != http.StatusProxyAuthRequired || !strings.HasPrefix(resp.Header.Get("Proxy-Authenticate"), "Basic ") {
				t.Errorf("CONNECT: %s %q, want 407 with a Basic challenge", resp.Status, resp.Header.Get("Proxy-Authenticate"))
			}
			r := get(t, s.client(t, user, nil), origin.URL)
			if r.Status != http.StatusProxyAuthRequired {
				t.Errorf("plain: %d, want 407", r.Status)
			}
		})
	}
	good := s.client(t, url.UserPassword("scraper", "s3cret:pw"), nil)
	if r := postForm(t, good, "https://ocr.captchaai.com/in.php", imageForm(keyA, 1, false)); !strings.HasPrefix(r.Body, "OK|") {
		t.Errorf("MITM with credentials: %d %q", r.Status, r.Body)
	}
	if r := get(t, good, origin.URL); r.Body != "origin" {
		t.Errorf("plain with credentials: %d %q", r.Status, r.Body)
	}
	if r := postForm(t, directClient(t), s.URL+"/in.php", imageForm(keyA, 1, false)); !strings.HasPrefix(r.Body, "OK|") {
		t.Errorf("base-URL mode: %d %q", r.Status, r.Body)
	}
	if got := s.Srv.Stats.AuthFailures.Load(); got != 6 {
		t.Errorf("Stats.AuthFailures = %d, want 6", got)
	}
}
