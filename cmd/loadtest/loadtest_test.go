package main

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// TestMain lets the test binary play the server roles the load test
// starts by re-executing itself.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestParseRates(t *testing.T) {
	rs, err := parseRates("max, half,200")
	if err != nil || len(rs) != 3 || !rs[0].max || !rs[1].half || rs[2].perSec != 200 {
		t.Fatalf("parseRates: %+v, %v", rs, err)
	}
	for _, bad := range []string{"half,max", "0", "-3", "fast", ""} {
		if _, err := parseRates(bad); err == nil {
			t.Errorf("parseRates(%q): want an error", bad)
		}
	}
}

func TestFlagsTalkToLoopbackOnly(t *testing.T) {
	var stderr bytes.Buffer
	for _, args := range [][]string{
		{"-target", "http://10.0.0.1:8080", "-upstream", "http://127.0.0.1:1"},
		{"-target", "http://127.0.0.1:8080", "-upstream", "https://ocr.captchaai.com"},
		{"-target", "http://127.0.0.1:8080"},
		{"-scenario", "nope"},
		{"-dup", "1.5"},
	} {
		if _, err := parseFlags(args, &stderr); err == nil {
			t.Errorf("parseFlags(%q): want an error", args)
		}
	}
	if _, err := parseFlags([]string{"-target", "http://localhost:1", "-upstream", "http://[::1]:2"}, &stderr); err != nil {
		t.Errorf("loopback target refused: %v", err)
	}

	dial := loopbackDial(nil)
	for _, addr := range []string{"ocr.captchaai.com:80", "10.1.2.3:80", "[2001:db8::1]:443"} {
		if c, err := dial(context.Background(), "tcp", addr); err == nil {
			c.Close()
			t.Errorf("dialled %s", addr)
		} else if !strings.Contains(err.Error(), "loopback only") && !strings.Contains(err.Error(), "refusing") {
			t.Errorf("dial %s: %v", addr, err)
		}
	}
}

// The mix targeter submits distinct captchas and repeats, polls what it
// was given, keeps polling what is not ready, and stops when it is.
func TestMixTargeter(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newMix(mixConfig{
		key: "k", attack: "a", distinct: 3, dup: 0, pollers: 2, interval: time.Second,
		url: func(p string) string { return "http://x" + p },
	}, func() time.Time { return now })

	var tg vegeta.Target
	bodies := map[string]bool{}
	for range 5 {
		if err := m.next(&tg); err != nil {
			t.Fatal(err)
		}
		if tg.Method != http.MethodPost || tg.URL != "http://x/in.php" {
			t.Fatalf("want a submission, got %s %s", tg.Method, tg.URL)
		}
		bodies[string(tg.Body)] = true
	}
	if len(bodies) != 3 {
		t.Fatalf("dup 0 with 3 distinct: %d different bodies, want 3 (then repeats)", len(bodies))
	}

	m.observe(&vegeta.Result{Code: 200, Method: http.MethodPost, Body: []byte("OK|42")})
	_ = m.next(&tg)
	if tg.Method != http.MethodPost {
		t.Fatal("polls before their interval")
	}
	now = now.Add(time.Second)
	for range 2 { // two pollers
		_ = m.next(&tg)
		u, _ := url.Parse(tg.URL)
		if tg.Method != http.MethodGet || u.Path != "/res.php" || u.Query().Get("id") != "42" {
			t.Fatalf("want a poll of 42, got %s %s", tg.Method, tg.URL)
		}
	}
	m.observe(&vegeta.Result{Code: 200, Method: http.MethodGet, URL: tg.URL, Body: []byte("CAPCHA_NOT_READY")})
	m.observe(&vegeta.Result{Code: 200, Method: http.MethodGet, URL: tg.URL, Body: []byte("OK|ANSWER")})
	now = now.Add(time.Second)
	_ = m.next(&tg)
	if tg.Method != http.MethodGet {
		t.Fatal("a not-ready task is polled again")
	}
	_ = m.next(&tg)
	if tg.Method != http.MethodPost {
		t.Fatal("a solved task is not polled again")
	}

	always := newMix(mixConfig{key: "k", attack: "b", distinct: 100, dup: 1, url: func(p string) string { return p }}, time.Now)
	bodies = map[string]bool{}
	for range 50 {
		_ = always.next(&tg)
		bodies[string(tg.Body)] = true
	}
	if len(bodies) != 1 {
		t.Fatalf("dup 1: %d different captchas, want 1", len(bodies))
	}
}

// buildSolveonce builds the binary under test once per test.
func buildSolveonce(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "solveonce")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/solveonce/solveonce").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// A tiny run of every scenario and both modes, against every baseline:
// it starts everything, measures, reports and stops everything. Real
// measurements are manual (see README: load testing).
func TestLoadtestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers and builds solveonce; skipped with -short")
	}
	bin := buildSolveonce(t)
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"mix baseurl", []string{"-scenario", "mix", "-mode", "baseurl", "-rate", "30", "-distinct", "5", "-dup", "0.5",
			"-pollers", "2", "-poll-interval", "100ms"}, []string{"savings: solveonce sent"}},
		{"hit proxy", []string{"-scenario", "hit", "-mode", "proxy", "-rate", "max,half", "-workers", "2"},
			[]string{"solveonce vs static:", "rate half = "}},
		{"pass baseurl", []string{"-scenario", "pass", "-rate", "20"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"-solveonce", bin, "-duration", "1s", "-warmup", "0", "-max-time", "90s"}, c.args...)
			if err := run(ctx, args, &stdout, &stderr); err != nil {
				t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
			}
			out := stdout.String()
			t.Logf("\n%s", out)
			for _, s := range append([]string{"solveonce vs direct:", "solveonce vs revproxy:"}, c.want...) {
				if !strings.Contains(out, s) {
					t.Errorf("output lacks %q", s)
				}
			}
			if strings.Contains(out, " error: ") {
				t.Errorf("errors during the run:\n%s", out)
			}
		})
	}
}
