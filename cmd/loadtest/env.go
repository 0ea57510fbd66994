package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Names of the targets.
const (
	targetSolveonce = "solveonce"
	targetDirect    = "direct"
	targetRevproxy  = "revproxy"
	targetStatic    = "static"
)

// interceptHost is the CaptchaAI host clients name in proxy mode. It is
// never resolved: requests for it go to the proxy under test (on
// loopback), and the attacker's dialer refuses anything but loopback.
const interceptHost = "ocr.captchaai.com"

// target is one server under test.
type target struct {
	name string
	// base is the server's URL: the base URL clients call in baseurl mode,
	// the proxy they go through in proxy mode.
	base string
	// proxied is true when clients reach it as an HTTP proxy.
	proxied bool
	// admin is solveonce's admin URL ("" for the others).
	admin string
}

// url returns the URL a client requests for path (with query).
func (t *target) url(path string) string {
	if t.proxied {
		return "http://" + interceptHost + path
	}
	return t.base + path
}

// proxyURL is the proxy a client must use, or nil.
func (t *target) proxyURL() *url.URL {
	if !t.proxied {
		return nil
	}
	u, _ := url.Parse(t.base) // checked when the target was made
	return u
}

// client returns a loopback-only client for t.
func (t *target) client(timeout time.Duration, conns int) *http.Client {
	return &http.Client{
		Transport: newTransport(t.proxyURL(), conns),
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// environment is the servers of a run.
type environment struct {
	tmp      string
	children []*child
	fake     string // base URL of the fake CaptchaAI
	control  string // URL of the fake's counters; "" when the fake is not ours
	targets  []*target
	log      io.Writer
}

// close stops every child and removes the temporary directory.
func (e *environment) close() {
	for i := len(e.children) - 1; i >= 0; i-- {
		e.children[i].stop()
	}
	if e.tmp != "" {
		_ = os.RemoveAll(e.tmp)
	}
}

// target returns the target named name.
func (e *environment) target(name string) (*target, bool) {
	for _, t := range e.targets {
		if t.name == name {
			return t, true
		}
	}
	return nil, false
}

// startEnvironment starts the fake CaptchaAI, solveonce and the baselines
// o asks for. The environment it returns (even with an error) must be
// closed.
func startEnvironment(ctx context.Context, o options, log io.Writer) (*environment, error) {
	tmp, err := os.MkdirTemp("", "solveonce-loadtest-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	e := &environment{tmp: tmp, log: log}
	proxied := o.mode == "proxy"

	if o.upstream != "" {
		e.fake = strings.TrimSuffix(o.upstream, "/")
	} else {
		c, addrs, err := startRole(ctx, roleFake,
			latencyEnv+"="+o.latency.String(), solveAfterEnv+"="+strconv.Itoa(o.solveAfter))
		if c != nil {
			e.children = append(e.children, c)
		}
		if err != nil {
			return e, err
		}
		e.fake, e.control = "http://"+addrs["ADDR"], "http://"+addrs["CONTROL"]
	}

	if o.target != "" {
		e.targets = append(e.targets, &target{name: targetSolveonce, base: strings.TrimSuffix(o.target, "/"), proxied: proxied, admin: o.targetAdmin})
	} else {
		t, err := e.startSolveonce(ctx, o)
		if err != nil {
			return e, err
		}
		t.proxied = proxied
		e.targets = append(e.targets, t)
	}

	if o.baseline {
		e.targets = append(e.targets, &target{name: targetDirect, base: e.fake})
		c, addrs, err := startRole(ctx, roleRevproxy, upstreamEnv+"="+e.fake)
		if c != nil {
			e.children = append(e.children, c)
		}
		if err != nil {
			return e, err
		}
		e.targets = append(e.targets, &target{name: targetRevproxy, base: "http://" + addrs["ADDR"], proxied: proxied})
	}
	return e, nil
}

// startStatic starts the static baseline serving body.
func (e *environment) startStatic(ctx context.Context, body []byte, proxied bool) error {
	c, addrs, err := startRole(ctx, roleStatic, bodyEnv+"="+string(body))
	if c != nil {
		e.children = append(e.children, c)
	}
	if err != nil {
		return err
	}
	e.targets = append(e.targets, &target{name: targetStatic, base: "http://" + addrs["ADDR"], proxied: proxied})
	return nil
}

// startSolveonce starts solveonce in front of the fake, on free loopback
// ports, logging warnings and errors only, and waits until it is ready.
func (e *environment) startSolveonce(ctx context.Context, o options) (*target, error) {
	bin := o.solveonce
	if bin == "" {
		bin = filepath.Join(e.tmp, "solveonce")
		fmt.Fprintln(e.log, "loadtest: building solveonce (go build github.com/solveonce/solveonce)…")
		bctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(bctx, "go", "build", "-o", bin, "github.com/solveonce/solveonce").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("building solveonce (or pass -solveonce): %w\n%s", err, out)
		}
	}
	proxyAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	adminAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"-listen", proxyAddr, "-admin", adminAddr, "-upstream", e.fake}
	if o.config != "" {
		args = append(args, "-config", o.config)
	}
	c, stdout, err := startChild(targetSolveonce, bin, args, []string{
		"HOME=" + e.tmp, "XDG_CONFIG_HOME=" + e.tmp, "SOLVEONCE_DATA_DIR=" + e.tmp, "SOLVEONCE_LOG_LEVEL=warn",
	})
	if c != nil {
		e.children = append(e.children, c)
	}
	if err != nil {
		return nil, err
	}
	go func() { _, _ = io.Copy(io.Discard, bufio.NewReader(stdout)) }()
	t := &target{name: targetSolveonce, base: "http://" + proxyAddr, admin: "http://" + adminAddr}
	if err := waitReady(ctx, t.admin+"/readyz", 20*time.Second, c); err != nil {
		return nil, fmt.Errorf("solveonce: %w: %s", err, c.log)
	}
	return t, nil
}

// waitReady polls url until it answers 200, c exits, or within passes.
func waitReady(ctx context.Context, url string, within time.Duration, c *child) error {
	hc := &http.Client{Transport: newTransport(nil, 1), Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c != nil && c.exited() {
			return errors.New("exited")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%w within %v", errNotReady, within)
}

// freeLoopbackAddr returns a 127.0.0.1 address that was free a moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// upstreamCounts returns what reached the fake CaptchaAI so far: from the
// fake itself when it is ours, else (for solveonce) from its /metrics.
// ok is false when neither is available.
func (e *environment) upstreamCounts(ctx context.Context, t *target) (counters, bool) {
	hc := &http.Client{Transport: newTransport(nil, 1), Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	get := func(u string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: %s", u, resp.Status)
		}
		return io.ReadAll(resp.Body)
	}
	if e.control != "" {
		b, err := get(e.control)
		var c counters
		if err == nil && json.Unmarshal(b, &c) == nil {
			return c, true
		}
		return counters{}, false
	}
	if t.admin == "" {
		return counters{}, false
	}
	b, err := get(t.admin + "/metrics")
	if err != nil {
		return counters{}, false
	}
	var c counters
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "solveonce_upstream_requests_total{") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		c.Requests += int64(v)
		switch {
		case strings.Contains(line, `endpoint="in.php"`):
			c.SubmitRequests += int64(v)
		case strings.Contains(line, `endpoint="res.php"`):
			c.Polls += int64(v)
		}
	}
	return c, true
}
