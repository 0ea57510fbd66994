// Command fakecaptchaai runs a fake CaptchaAI server (package
// captchaaitest) on a local port, so that solveonce, or any CaptchaAI /
// 2captcha client, can be tried end to end without an API key and without
// spending money. It speaks the in.php/res.php protocol byte for byte,
// solves every task after a configurable number of polls (or time), and
// can inject the faults the real service shows (no slot, HTML 500/502
// pages, connection resets, hangs).
//
// Usage:
//
//	go run ./cmd/fakecaptchaai -listen 127.0.0.1:8081 -solve-after 2 -latency 0 -fail-ratio 0 -fault noslot
//
// It prints its base URL on standard output and stops on SIGINT or SIGTERM.
// Any 32-character [0-9a-z] API key is accepted unless -keys is given.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/solveonce/solveonce/captchaaitest"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "fakecaptchaai:", err)
		os.Exit(2)
	}
}

// solveAfter is the -solve-after flag: a number of polls or a duration.
type solveAfter struct {
	polls int
	dur   time.Duration
	timed bool
}

func (s *solveAfter) String() string {
	if s.timed {
		return s.dur.String()
	}
	return strconv.Itoa(s.polls)
}

func (s *solveAfter) Set(v string) error {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return fmt.Errorf("negative poll count %d", n)
		}
		s.polls, s.timed = n, false
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("want a poll count or a duration: %w", err)
	}
	if d < 0 {
		return fmt.Errorf("negative duration %s", d)
	}
	s.dur, s.timed = d, true
	return nil
}

// run parses args, starts the server and serves until ctx is done or a
// signal arrives.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fakecaptchaai", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: fakecaptchaai [flags]

Runs a fake CaptchaAI (in.php/res.php) on a local port so solveonce and
CaptchaAI clients can be tried without spending money. Prints the base URL
and stops on SIGINT/SIGTERM.

Flags:
`)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "127.0.0.1:8081", "`address` to listen on")
	solve := solveAfter{polls: captchaaitest.DefaultSolveAfterPolls}
	fs.Var(&solve, "solve-after", "a task is solved on this poll (`n`; 0 = at once), or after this duration when given as one (e.g. 15s)")
	latency := fs.Duration("latency", 0, "delay added before every answer")
	failRatio := fs.Float64("fail-ratio", 0, "fraction (0..1) of requests that get -fault")
	fault := fs.String("fault", "noslot", "fault injected by -fail-ratio: none, noslot, servererror, html500, html502, reset, resetafter, timeout")
	endpoint := fs.String("fault-endpoint", "both", "endpoint -fail-ratio applies to: in.php, res.php or both")
	keys := fs.String("keys", "", "comma-separated API keys to accept (default: any 32-character [0-9a-z] key)")
	threads := fs.Int("threads", 0, "per-key limit of unsolved tasks, over it in.php answers ERROR_NO_SLOT_AVAILABLE (0 = unlimited)")
	numeric := fs.String("numeric-json-ids", "userrecaptcha", "comma-separated methods whose JSON task IDs are numbers")
	errText := fs.Bool("error-text", false, "JSON errors carry error_text")
	balance := fs.String("balance", captchaaitest.DefaultBalance, "getbalance answer")
	seed := fs.Uint64("seed", 1, "seed of the -fail-ratio generator")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	f, err := captchaaitest.ParseFault(*fault)
	if err != nil {
		return fmt.Errorf("-fault: %w", err)
	}
	if *failRatio < 0 || *failRatio > 1 {
		return fmt.Errorf("-fail-ratio %v out of range 0..1", *failRatio)
	}
	var endpoints []string
	switch *endpoint {
	case "both":
		endpoints = []string{"in.php", "res.php"}
	case "in.php", "res.php":
		endpoints = []string{*endpoint}
	default:
		return fmt.Errorf("-fault-endpoint %q: want in.php, res.php or both", *endpoint)
	}

	opts := []captchaaitest.Option{
		captchaaitest.Latency(*latency),
		captchaaitest.Threads(*threads),
		captchaaitest.ErrorText(*errText),
		captchaaitest.Balance(*balance),
		captchaaitest.Seed(*seed),
		captchaaitest.NumericJSONIDs(splitList(*numeric)...),
	}
	if solve.timed {
		opts = append(opts, captchaaitest.SolveAfter(solve.dur))
	} else {
		opts = append(opts, captchaaitest.SolveAfterPolls(solve.polls))
	}
	if k := splitList(*keys); len(k) > 0 {
		opts = append(opts, captchaaitest.ValidKeys(k...))
	}

	s, err := captchaaitest.Start(*listen, opts...)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer s.Close()
	if *failRatio > 0 {
		for _, ep := range endpoints {
			s.FailRatio(ep, *failRatio, f)
		}
	}
	fmt.Fprintln(stdout, s.URL)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Fprintf(stderr, "fakecaptchaai: shutting down (%d requests, %d tasks created)\n", s.Requests(), s.Submits())
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
