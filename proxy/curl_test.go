package proxy

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// curlOrSkip returns curl's path, skipping loudly when it is missing (or
// failing when SOLVEONCE_REQUIRE_CURL=1).
func curlOrSkip(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("curl")
	if err != nil {
		msg := "!!! curl is not on PATH: the curl client tests did NOT run (install curl, or set SOLVEONCE_REQUIRE_CURL=1 to make this a failure) !!!"
		if os.Getenv("SOLVEONCE_REQUIRE_CURL") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// curl runs curl through the proxy with a clean environment (no
// *_proxy or NO_PROXY variables, no ~/.curlrc) and returns its output.
func runCurl(t *testing.T, curl string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, curl, append([]string{"-q", "-sS", "--max-time", "10"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// curl -x … --cacert …: https and plain-http CaptchaAI calls are answered
// by solveonce (deduplicated with base-URL mode's engine), and curl never
// resolves ocr.captchaai.com.
func TestCurlThroughProxy(t *testing.T) {
	curl := curlOrSkip(t)
	s := newStack(t, stackOptions{cfg: func(c *Config) { c.AuthUser = "u"; c.AuthPassword = "p" }})
	proxy := "http://" + s.Addr
	q := url.Values{"key": {keyA}, "method": {"userrecaptcha"}, "googlekey": {"6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"}, "pageurl": {"https://example.com/"}}
	img := imageForm(keyA, 5, false)

	out, err := runCurl(t, curl, "-x", proxy, "-U", "u:p", "--cacert", s.CAFile, "-D", "-",
		"--data", img.Encode(), "https://ocr.captchaai.com/in.php")
	if err != nil || !strings.Contains(out, "OK|") || !strings.Contains(strings.ToLower(out), "x-solveonce: miss") {
		t.Fatalf("curl https in.php: %v\n%s", err, out)
	}
	id := out[strings.Index(out, "OK|")+3:]
	out, err = runCurl(t, curl, "-x", proxy, "-U", "u:p", "--data", img.Encode(), "http://ocr.captchaai.com/in.php")
	if err != nil || out != "OK|"+id {
		t.Fatalf("curl plain-http in.php: %v %q, want OK|%s", err, out, id)
	}
	out, err = runCurl(t, curl, "-x", proxy, "-U", "u:p", "--cacert", s.CAFile, "https://ocr.captchaai.com/in.php?"+q.Encode())
	if err != nil || !strings.HasPrefix(out, "OK|") {
		t.Fatalf("curl https GET in.php: %v %q", err, out)
	}
	if got := s.Fake.Submits(); got != 2 {
		t.Errorf("%d submits upstream, want 2 (one image, one token)", got)
	}

	// Without our CA curl must refuse the MITM certificate…
	if out, err := runCurl(t, curl, "-x", proxy, "-U", "u:p", "--cacert", os.DevNull, "https://ocr.captchaai.com/in.php?"+q.Encode()); err == nil {
		t.Errorf("curl accepted the MITM certificate without trusting our CA: %q", out)
	}
	// …and without credentials the proxy answers 407.
	out, err = runCurl(t, curl, "-x", proxy, "-o", os.DevNull, "-w", "%{http_code}", "http://ocr.captchaai.com/in.php")
	if err != nil || out != "407" {
		t.Errorf("curl without credentials: %v %q, want 407", err, out)
	}
}
