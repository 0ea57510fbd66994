// Package redistest runs a throwaway redis-server for tests: one child
// process per Start, on a free loopback port, with no persistence, stopped
// when the test ends. Stop and Restart let a test simulate an outage.
//
// When redis-server is not on PATH the calling test is skipped loudly, or
// fails if SOLVEONCE_REQUIRE_REDIS=1 (as CI sets it), so a missing install
// can never pass for green.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv is the environment variable that, set to "1", turns a missing
// redis-server from a skip into a test failure.
const RequireEnv = "SOLVEONCE_REQUIRE_REDIS"

const (
	// startTimeout bounds the wait for a started server to answer PING.
	startTimeout = 5 * time.Second
	// startAttempts bounds how many ports Start tries.
	startAttempts = 5
	// stopTimeout bounds the wait for a killed server to be reaped.
	stopTimeout = 10 * time.Second
)

// Server is one redis-server child process owned by a test.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex // guards proc
	proc *process   // nil while stopped
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	log  string        // path of its output
	done chan struct{} // closed once cmd.Wait returned
}

// Start starts a redis-server for tb on a free 127.0.0.1 port and registers
// its shutdown with tb.Cleanup. It skips tb (or fails it, when
// SOLVEONCE_REQUIRE_REDIS=1) if redis-server is not installed, and fails tb
// if no server could be started.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		const fix = "install it (apt-get install redis-server, or .ci/install-redis.sh) or run .ci/run"
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("redis-server not installed and %s=1: Redis tests FAILED; %s", RequireEnv, fix)
		}
		tb.Skip("!!! redis-server not installed: Redis tests SKIPPED; " + fix + " !!!")
	}
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir()}
	tb.Cleanup(s.Stop)

	var errs []error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.port = port
		if err := s.start(); err != nil {
			errs = append(errs, err)
			continue
		}
		return s
	}
	tb.Fatalf("redistest: could not start redis-server in %d attempts: %v", startAttempts, errors.Join(errs...))
	return nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Options returns client options for the server: its address and nothing
// else. Tests adjust them (timeouts, retries) before redis.NewClient.
func (s *Server) Options() *redis.Options {
	return &redis.Options{Addr: s.Addr()}
}

// Client returns a client of the server, closed when tb ends. Each opt may
// adjust the options first (for example short timeouts for outage tests).
func (s *Server) Client(tb testing.TB, opts ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	o := s.Options()
	for _, opt := range opts {
		opt(o)
	}
	c := redis.NewClient(o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server at once (SIGKILL: no shutdown handshake, as in a
// crash) and waits for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	if err := p.kill(); err != nil {
		s.tb.Errorf("redistest: %v", err)
	}
}

// Restart starts the server again on the same port after Stop (stopping it
// first if it is running) and waits until it answers. The data is gone: the
// server keeps nothing on disk. It fails the test if the server does not
// come back within a few seconds.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	// The port was ours a moment ago; something else may grab it in
	// between, so try a few times before giving up.
	var errs []error
	for range startAttempts {
		err := s.start()
		if err == nil {
			return
		}
		errs = append(errs, err)
		time.Sleep(100 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart on port %d: %v", s.port, errors.Join(errs...))
}

// start runs redis-server on s.port and waits until it answers PING.
func (s *Server) start() error {
	logPath := filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("redistest: open log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor

	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--protected-mode", "yes",
		"--daemonize", "no",
		"--dir", s.dir,
	)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	setParentDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := waitReady(ctx, s.Addr(), p.done); err != nil {
		killErr := p.kill()
		return fmt.Errorf("redistest: redis-server on port %d: %w (log: %s)", s.port, errors.Join(err, killErr), p.logTail())
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// kill sends SIGKILL and waits (bounded) for the process to be reaped.
func (p *process) kill() error {
	select {
	case <-p.done:
		return nil // already exited
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill redis-server (pid %d): %w", p.cmd.Process.Pid, err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("redis-server (pid %d) did not exit within %v of SIGKILL", p.cmd.Process.Pid, stopTimeout)
	}
}

// logTail returns the last lines of the process's output, for errors.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	const limit = 2000
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return string(bytes.TrimSpace(b))
}

// waitReady polls addr with a raw PING until it answers +PONG, the process
// exits (exited is closed), or ctx ends.
func waitReady(ctx context.Context, addr string, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-exited:
			return errors.New("exited during startup")
		default:
		}
		if last = ping(ctx, addr); last == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during startup")
		case <-ctx.Done():
			return fmt.Errorf("no PONG within %v: %w", startTimeout, errors.Join(ctx.Err(), last))
		case <-tick.C:
		}
	}
}

// ping sends one inline PING over a fresh connection.
func ping(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return err
		}
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	return port, nil
}
