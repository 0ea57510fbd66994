// Command loadtest measures solveonce under load with vegeta (used as a
// library) and reports it against baselines measured in the same run.
//
// It starts, on 127.0.0.1 only, a fake CaptchaAI (package captchaaitest),
// solveonce in front of it (built from this module, or given with
// -solveonce), and with -baseline the references the figures are compared
// with: the fake itself ("direct"), a default httputil.ReverseProxy in front
// of it ("revproxy"), and, for the cache-hit scenario, a minimal Go handler
// serving the same answer bytes from memory ("static"). Every server runs in
// a process of its own (this binary re-executed, or solveonce), so that the
// attacker, alone in this process, loads each target the same way.
//
// Scenarios:
//
//	mix   the realistic one: in.php submissions of -distinct captchas, each
//	      a repeat of a recent captcha with probability -dup, and -pollers
//	      pollers per task polling res.php every -poll-interval until the
//	      answer is ready; client requests vs upstream requests show the
//	      savings
//	hit   res.php for a solved task: solveonce answers from its cache
//	pass  res.php?action=getbalance: solveonce passes every request through
//
// In -mode baseurl clients call solveonce as their CaptchaAI base URL; in
// -mode proxy they call http://ocr.captchaai.com through it as an HTTP
// proxy (HTTP_PROXY), and the baselines are used the same way.
//
// -rate takes a list: requests per second, "max" (as fast as -workers
// connections allow), or "half" (half the throughput solveonce reached at
// "max" earlier in the run). Fixed rates are paced over at most
// -max-workers connections (default: -workers), so that a saturated
// machine shows as a target that did not sustain the rate (flagged in the
// report) rather than as thousands of new connections. Each rate is
// measured -repeat times, the targets interleaved, and medians are
// reported, with solveonce's figures as ratios to each baseline.
//
// Examples:
//
//	go run ./cmd/loadtest -scenario hit -rate max,half -duration 15s -repeat 3
//	go run ./cmd/loadtest -scenario mix -rate 200 -duration 20s -distinct 500 -dup 0.6 -pollers 2
//	go run ./cmd/loadtest -scenario pass -mode proxy -rate max -duration 10s
//
// The run is bounded by -max-time; every process it started is stopped
// before it returns. Nothing but 127.0.0.1 is ever contacted: the
// attacker's dialer refuses any other address.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case err != nil:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	scenario     string
	mode         string
	rates        []rateSpec
	duration     time.Duration
	warmup       time.Duration
	repeat       int
	workers      int
	maxWorkers   int
	timeout      time.Duration
	distinct     int
	dup          float64
	pollers      int
	pollInterval time.Duration
	baseline     bool
	solveonce    string
	config       string
	target       string
	targetAdmin  string
	upstream     string
	latency      time.Duration
	solveAfter   int
	key          string
	maxTime      time.Duration
}

// rateSpec is one entry of -rate.
type rateSpec struct {
	perSec int  // > 0: fixed rate
	max    bool // as fast as the workers go
	half   bool // half of solveonce's throughput at max
}

func (r rateSpec) String() string {
	switch {
	case r.max:
		return "max"
	case r.half:
		return "half"
	}
	return strconv.Itoa(r.perSec)
}

func parseRates(s string) ([]rateSpec, error) {
	var out []rateSpec
	sawMax := false
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "max":
			out, sawMax = append(out, rateSpec{max: true}), true
		case "half":
			if !sawMax {
				return nil, errors.New(`-rate: "half" must follow "max" (it is half of the throughput measured there)`)
			}
			out = append(out, rateSpec{half: true})
		default:
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("-rate: %q is not a positive number, max or half", f)
			}
			out = append(out, rateSpec{perSec: n})
		}
	}
	return out, nil
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var rates string
	fs.StringVar(&o.scenario, "scenario", "mix", "traffic: `mix` (realistic submissions and polls), hit (res.php cache hits) or pass (getbalance, passed through)")
	fs.StringVar(&o.mode, "mode", "baseurl", "how clients reach solveonce: `baseurl` or proxy (HTTP_PROXY style)")
	fs.StringVar(&rates, "rate", "50", "comma-separated `rates`: requests/s, max (as fast as -workers allow) or half (half of solveonce's throughput at max)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measured attack")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured attack before each measured one (0 = none)")
	fs.IntVar(&o.repeat, "repeat", 1, "rounds per rate; medians are reported")
	fs.IntVar(&o.workers, "workers", 32, "concurrent connections at -rate max")
	fs.IntVar(&o.maxWorkers, "max-workers", 0, "most concurrent connections at a fixed rate; 0 = -workers (a target that cannot keep up is flagged); raise it for an open-loop test")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "per-request timeout")
	fs.IntVar(&o.distinct, "distinct", 100, "mix: distinct captchas per attack")
	fs.Float64Var(&o.dup, "dup", 0.5, "mix: probability that a submission repeats a captcha already submitted")
	fs.IntVar(&o.pollers, "pollers", 2, "mix: pollers per submitted task")
	fs.DurationVar(&o.pollInterval, "poll-interval", time.Second, "mix: wait between two polls of one poller")
	fs.BoolVar(&o.baseline, "baseline", true, "also measure direct-to-upstream, a default httputil.ReverseProxy and (hit) a static handler")
	fs.StringVar(&o.solveonce, "solveonce", "", "solveonce `binary` to start; \"\" builds it from this module with `go build`")
	fs.StringVar(&o.config, "config", "", "TOML `file` given to the started solveonce (-config)")
	fs.StringVar(&o.target, "target", "", "attack an already running solveonce at this loopback `URL` instead of starting one (its upstream must be -upstream)")
	fs.StringVar(&o.targetAdmin, "target-admin", "", "admin `URL` of -target, read for its upstream request counts")
	fs.StringVar(&o.upstream, "upstream", "", "with -target: the loopback `URL` of the fake CaptchaAI that solveonce uses (e.g. go run ./cmd/fakecaptchaai)")
	fs.DurationVar(&o.latency, "upstream-latency", 0, "latency the started fake CaptchaAI adds to every answer")
	fs.IntVar(&o.solveAfter, "solve-after", 2, "the started fake solves a task on this poll")
	fs.StringVar(&o.key, "key", "0123456789abcdef0123456789abcdef", "API `key` the clients use (the fake accepts any 32-character key)")
	fs.DurationVar(&o.maxTime, "max-time", 15*time.Minute, "bound on the whole run")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: loadtest [flags]   (see go doc ./cmd/loadtest)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.rates, err = parseRates(rates); err != nil {
		return o, err
	}
	var problems []string
	switch o.scenario {
	case "mix", "hit", "pass":
	default:
		problems = append(problems, fmt.Sprintf("-scenario %q: want mix, hit or pass", o.scenario))
	}
	switch o.mode {
	case "baseurl", "proxy":
	default:
		problems = append(problems, fmt.Sprintf("-mode %q: want baseurl or proxy", o.mode))
	}
	if o.duration <= 0 || o.warmup < 0 || o.timeout <= 0 || o.maxTime <= 0 || o.pollInterval <= 0 {
		problems = append(problems, "-duration, -timeout, -max-time and -poll-interval must be positive, -warmup not negative")
	}
	if o.repeat < 1 || o.workers < 1 || o.distinct < 1 || o.pollers < 0 || o.solveAfter < 0 || o.maxWorkers < 0 {
		problems = append(problems, "-repeat, -workers and -distinct must be at least 1; -pollers, -solve-after and -max-workers not negative")
	}
	if o.maxWorkers == 0 {
		o.maxWorkers = o.workers
	}
	if o.dup < 0 || o.dup > 1 {
		problems = append(problems, "-dup must be within 0..1")
	}
	if len(o.key) != 32 {
		problems = append(problems, "-key must have 32 characters")
	}
	for _, u := range []struct{ flag, url string }{{"-target", o.target}, {"-target-admin", o.targetAdmin}, {"-upstream", o.upstream}} {
		if u.url != "" {
			if err := checkLoopbackURL(u.url); err != nil {
				problems = append(problems, u.flag+": "+err.Error())
			}
		}
	}
	if (o.target == "") != (o.upstream == "") {
		problems = append(problems, "-target and -upstream go together")
	}
	if len(problems) > 0 {
		return o, errors.New(strings.Join(problems, "; "))
	}
	return o, nil
}

// run is the whole load test: start the servers, measure, report, stop.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.maxTime)
	defer cancel()

	env, err := startEnvironment(ctx, o, stderr)
	if env != nil {
		defer env.close()
	}
	if err != nil {
		return err
	}
	sc, err := prepareScenario(ctx, o, env)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "solveonce load test: scenario %s, mode %s, %d CPUs, %s, %s/attack, %d round(s), median reported\n",
		o.scenario, o.mode, runtime.NumCPU(), runtime.Version(), o.duration, o.repeat)
	fmt.Fprintf(stdout, "%s\n", sc.describe(o))

	var maxThroughput float64 // solveonce's at "max", for "half"
	for _, rs := range o.rates {
		rate := rs
		if rs.half {
			if maxThroughput <= 0 {
				return errors.New(`-rate half: solveonce reached no throughput at "max"`)
			}
			rate = rateSpec{perSec: max(1, int(maxThroughput/2))}
		}
		tbl, err := measure(ctx, o, env, sc, rate)
		if err != nil {
			return err
		}
		label := rs.String()
		if rs.half {
			label = fmt.Sprintf("half = %d/s", rate.perSec)
		} else if rs.max {
			label = fmt.Sprintf("max, %d connections", o.workers)
		}
		tbl.print(stdout, label)
		if rs.max {
			if row, ok := tbl.row(targetSolveonce); ok {
				maxThroughput = row.throughput
			}
		}
	}
	return nil
}
