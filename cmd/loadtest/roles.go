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
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/solveonce/solveonce/captchaaitest"
)

// The servers of a run are this binary re-executed in a role, chosen by
// environment variables (so that the test binary can play them too).
const (
	roleEnv       = "LOADTEST_ROLE"        // fake, static or revproxy
	latencyEnv    = "LOADTEST_LATENCY"     // fake: added latency (duration)
	solveAfterEnv = "LOADTEST_SOLVE_AFTER" // fake: poll on which tasks are ready
	bodyEnv       = "LOADTEST_BODY"        // static: the bytes to serve
	upstreamEnv   = "LOADTEST_UPSTREAM"    // revproxy: where to proxy to
)

// The role servers.
const (
	roleFake     = "fake"
	roleStatic   = "static"
	roleRevproxy = "revproxy"
)

// runRole serves one role on 127.0.0.1 until stdin ends (the parent closed
// it or died) or a signal arrives. It prints "ADDR <host:port>" (and, for
// the fake, "CONTROL <host:port>" of its counters endpoint) on stdout, and
// returns the process exit code.
func runRole(role string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { // the parent closes our stdin to stop us, or dies
		_, _ = io.Copy(io.Discard, stdin)
		stop()
	}()
	if err := serveRole(ctx, role, stdout); err != nil {
		fmt.Fprintf(stderr, "loadtest %s: %v\n", role, err)
		return 1
	}
	return 0
}

func serveRole(ctx context.Context, role string, stdout io.Writer) error {
	var h http.Handler
	switch role {
	case roleFake:
		return serveFake(ctx, stdout)
	case roleStatic:
		body := []byte(os.Getenv(bodyEnv))
		h = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write(body)
		})
	case roleRevproxy:
		u, err := url.Parse(os.Getenv(upstreamEnv))
		if err != nil {
			return fmt.Errorf("%s: %w", upstreamEnv, err)
		}
		if err := checkLoopbackURL(u.String()); err != nil {
			return err
		}
		h = httputil.NewSingleHostReverseProxy(u) // deliberately the defaults
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Fprintf(stdout, "ADDR %s\n", ln.Addr())
	return serveUntil(ctx, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln)
}

// serveFake runs a fake CaptchaAI and a small endpoint reporting its
// counters.
func serveFake(ctx context.Context, stdout io.Writer) error {
	var opts []captchaaitest.Option
	if v := os.Getenv(latencyEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%s: %w", latencyEnv, err)
		}
		opts = append(opts, captchaaitest.Latency(d))
	}
	if v := os.Getenv(solveAfterEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s: %w", solveAfterEnv, err)
		}
		opts = append(opts, captchaaitest.SolveAfterPolls(n))
	}
	fake, err := captchaaitest.Start("127.0.0.1:0", opts...)
	if err != nil {
		return err
	}
	defer fake.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	control := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(counters{
			Requests: fake.Requests(), SubmitRequests: fake.SubmitRequests(), Submits: fake.Submits(), Polls: fake.Polls(),
		})
	})
	fmt.Fprintf(stdout, "ADDR %s\nCONTROL %s\n", strings.TrimPrefix(fake.URL, "http://"), ln.Addr())
	return serveUntil(ctx, &http.Server{Handler: control, ReadHeaderTimeout: 10 * time.Second}, ln)
}

// counters are what the fake CaptchaAI saw.
type counters struct {
	Requests       int64 `json:"requests"`
	SubmitRequests int64 `json:"submit_requests"`
	Submits        int64 `json:"submits"`
	Polls          int64 `json:"polls"`
}

func (c counters) sub(d counters) counters {
	return counters{c.Requests - d.Requests, c.SubmitRequests - d.SubmitRequests, c.Submits - d.Submits, c.Polls - d.Polls}
}

// serveUntil serves hs on ln until ctx is done, then shuts it down.
func serveUntil(ctx context.Context, hs *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	<-errc
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// child is a server process of the run.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when cmd.Wait returned
	log   *tailBuffer
	once  sync.Once
}

// startChild starts path with args and env (added to this process's
// environment, minus anything proxy- or solveonce-related) and returns once
// it runs. Its standard error is kept (the tail) for error messages.
func startChild(name, path string, args, env []string) (*child, io.Reader, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = append(cleanEnv(), env...)
	setParentDeathSignal(cmd)
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), log: &tailBuffer{max: 8 << 10}}
	cmd.Stderr = c.log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	c.stdin = stdin
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, stdout, nil
}

// startRole starts this binary in a role and returns its announced
// addresses by keyword (ADDR, CONTROL).
func startRole(ctx context.Context, role string, env ...string) (*child, map[string]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", role, err)
	}
	c, stdout, err := startChild(role, self, nil, append([]string{roleEnv + "=" + role}, env...))
	if err != nil {
		return nil, nil, err
	}
	want := 1
	if role == roleFake {
		want = 2
	}
	got := map[string]string{}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-c.done:
				return
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for len(got) < want {
		select {
		case l := <-lines:
			if k, v, ok := strings.Cut(l, " "); ok {
				got[k] = v
			}
		case <-c.done:
			return c, nil, fmt.Errorf("%s exited before listening: %s", role, c.log)
		case <-timer.C:
			return c, nil, fmt.Errorf("%s did not announce its address within 10s: %s", role, c.log)
		case <-ctx.Done():
			return c, nil, fmt.Errorf("%s: %w", role, ctx.Err())
		}
	}
	return c, got, nil
}

// stop asks the child to end (stdin closed, SIGTERM) and kills it if it
// has not within 10 seconds.
func (c *child) stop() {
	c.once.Do(func() {
		_ = c.stdin.Close()
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
}

// exited reports whether the child has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// cleanEnv is this process's environment without proxy settings (the run
// is loopback only) and without SOLVEONCE_ or LOADTEST_ variables (each
// child gets exactly the configuration it is given).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		u := strings.ToUpper(k)
		if strings.HasPrefix(u, "SOLVEONCE_") || strings.HasPrefix(u, "LOADTEST_") ||
			u == "HTTP_PROXY" || u == "HTTPS_PROXY" || u == "ALL_PROXY" || u == "NO_PROXY" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.b))
	if s == "" {
		return "(no output)"
	}
	return s
}

// errNotReady: a started server never became ready.
var errNotReady = errors.New("not ready")
