package captchaaitest

import (
	"fmt"
	"math/rand/v2"
	"path"
	"strings"
	"time"
)

// Fault is a failure injected into the answer of one request.
//
// On in.php the ambiguous faults (FaultHTML500, FaultResetAfter,
// FaultTimeout) create the task before failing, as real life does; the
// others create nothing. On res.php the ambiguous faults likewise process
// the poll (it counts towards readiness and may trigger a pingback) before
// failing, the others leave the task untouched.
type Fault int

const (
	// FaultNone answers normally.
	FaultNone Fault = iota
	// FaultNoSlot answers ERROR_NO_SLOT_AVAILABLE; nothing is created.
	FaultNoSlot
	// FaultServerError answers ERROR_SERVER_ERROR with HTTP 200; nothing is
	// created.
	FaultServerError
	// FaultHTML500 answers an HTML error page with status 500, after
	// creating the task (in.php): ambiguous, as in real life.
	FaultHTML500
	// FaultHTML502 answers an HTML error page with status 502 (a gateway
	// failing in front of the service); nothing is created.
	FaultHTML502
	// FaultReset closes the connection with a TCP reset without answering;
	// nothing is created. Note that Go's http.Transport silently retries an
	// idempotent request (GET) once when a reused keep-alive connection is
	// reset, as it would against the real service.
	FaultReset
	// FaultResetAfter reads the request, creates the task (in.php), then
	// resets the connection: ambiguous.
	FaultResetAfter
	// FaultTimeout creates the task (in.php), then never answers: the
	// request hangs until its context is done or the Server closes.
	FaultTimeout
)

var faultNames = [...]string{"none", "noslot", "servererror", "html500", "html502", "reset", "resetafter", "timeout"}

// String returns the fault's short name, as ParseFault reads it.
func (f Fault) String() string {
	if f >= 0 && int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("fault(%d)", int(f))
}

// ParseFault reads a fault name: none, noslot, servererror, html500,
// html502, reset, resetafter or timeout (case-insensitive; "-" and "_" are
// ignored, so "reset-after" works too).
func ParseFault(name string) (Fault, error) {
	n := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(strings.TrimSpace(name)))
	if n == "" {
		return FaultNone, nil
	}
	for i, s := range faultNames {
		if s == n {
			return Fault(i), nil
		}
	}
	return FaultNone, fmt.Errorf("captchaaitest: unknown fault %q (want one of %s)", name, strings.Join(faultNames[:], ", "))
}

// ambiguous reports whether f processes the request before failing.
func (f Fault) ambiguous() bool {
	return f == FaultHTML500 || f == FaultResetAfter || f == FaultTimeout
}

// Endpoints a fault applies to.
const (
	endpointIn  = 0
	endpointRes = 1
)

func endpointIndex(endpoint string) int {
	switch path.Base(strings.TrimSpace(endpoint)) {
	case "in.php", "in":
		return endpointIn
	case "res.php", "res":
		return endpointRes
	}
	panic(fmt.Sprintf("captchaaitest: unknown endpoint %q (want \"in.php\" or \"res.php\")", endpoint))
}

// pending is one FailNext/FailCode entry: n more requests get fault, or the
// protocol code when code is not empty.
type pending struct {
	n     int
	fault Fault
	code  string
}

// faultState is the fault configuration of one endpoint, guarded by
// Server.mu.
type faultState struct {
	queue []pending
	ratio float64
	fault Fault
	rng   *rand.Rand
}

// decision is what happens to one request.
type decision struct {
	fault Fault
	code  string // protocol code to answer instead (FailCode)
}

// FailNext makes the next n requests to endpoint ("in.php" or "res.php")
// that pass the key check get fault f. Entries queued by FailNext and
// FailCode are served in the order they were added; n <= 0 clears the
// endpoint's queue. It panics on an unknown endpoint.
func (s *Server) FailNext(endpoint string, n int, f Fault) {
	s.enqueue(endpointIndex(endpoint), pending{n: n, fault: f})
}

// FailCode makes the next n answers of endpoint be the protocol code (e.g.
// MAX_USER_TURN, ERROR_ZERO_BALANCE) with HTTP 200, in the requested
// format; nothing is created or polled. n <= 0 clears the endpoint's queue.
func (s *Server) FailCode(endpoint string, n int, code string) {
	s.enqueue(endpointIndex(endpoint), pending{n: n, code: code})
}

func (s *Server) enqueue(ep int, p pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.n <= 0 {
		s.faults[ep].queue = nil
		return
	}
	s.faults[ep].queue = append(s.faults[ep].queue, p)
}

// FailRatio makes a pseudo-random fraction ratio (0..1) of the requests to
// endpoint get fault f, once the FailNext/FailCode queue is empty. The
// generator is reseeded from the Seed option on every call, so the same
// sequence of requests gets the same faults. ratio 0 disables it.
func (s *Server) FailRatio(endpoint string, ratio float64, f Fault) {
	ep := endpointIndex(endpoint)
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := &s.faults[ep]
	fs.ratio = min(max(ratio, 0), 1)
	fs.fault = f
	fs.rng = rand.New(rand.NewPCG(s.cfg.seed, uint64(ep)+0x9e3779b97f4a7c15))
}

// SetOutage turns an outage on or off. During an outage every request is
// refused without being read (over HTTP the connection is reset; through
// Transport, RoundTrip fails with a dial error wrapping ECONNREFUSED) and
// nothing is created.
func (s *Server) SetOutage(on bool) { s.outage.Store(on) }

// SetLatency sets the delay added before every answer.
func (s *Server) SetLatency(d time.Duration) { s.latency.Store(int64(max(d, 0))) }

// nextFault takes the decision for one request to endpoint ep.
func (s *Server) nextFault(ep int) decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	fs := &s.faults[ep]
	if len(fs.queue) > 0 {
		p := &fs.queue[0]
		d := decision{fault: p.fault, code: p.code}
		p.n--
		if p.n <= 0 {
			fs.queue = fs.queue[1:]
		}
		return d
	}
	if fs.ratio > 0 && fs.rng != nil && fs.rng.Float64() < fs.ratio {
		return decision{fault: fs.fault}
	}
	return decision{}
}
