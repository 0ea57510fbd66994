package captchaaitest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// InProcessURL is the URL of a Server made by NewInProcess. Its host never
// resolves, so a request that bypasses Server.Transport fails instead of
// reaching something else.
const InProcessURL = "http://captchaai.invalid"

// Server is a fake CaptchaAI speaking in.php/res.php faithfully. All its
// methods are safe for concurrent use.
type Server struct {
	// URL is the base URL, e.g. http://127.0.0.1:PORT (no trailing slash).
	URL string

	cfg config

	latency atomic.Int64 // time.Duration
	outage  atomic.Bool

	requests       atomic.Int64
	submitRequests atomic.Int64
	submits        atomic.Int64
	polls          atomic.Int64
	reports        atomic.Int64
	refused        atomic.Int64
	pingbacks      atomic.Int64

	idBase uint64
	idSeq  atomic.Uint64

	mu         sync.Mutex
	closed     bool
	tasks      map[string]*task
	order      []string // task IDs, oldest first, from head on
	head       int
	unsolved   map[string]map[string]*task // key → ID → task not ready yet
	submitsFor map[string]int64
	faults     [2]faultState
	timers     map[string]*time.Timer // time-based pingbacks

	wg     sync.WaitGroup // handlers, round trips, pingbacks, timer callbacks
	connWG sync.WaitGroup // HTTP connections
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once

	srv       *http.Server
	serveDone chan struct{}
	pbClient  *http.Client
	pbTrans   *http.Transport
}

// task is a Task plus the Server's private state, guarded by Server.mu.
type task struct {
	Task
	pollRequests int64
	reportCount  int64
	pinged       bool
}

// Task is a snapshot of one task the fake holds.
type Task struct {
	ID          string
	Key         string
	Method      string
	Fingerprint string // captchaai.Request.Fingerprint() of the submission
	Params      url.Values
	Pingback    string
	Submitted   time.Time
	Polls       int // polls by the owning key that were processed

	// Image is the decoded image of an image task (method post/base64).
	Image []byte
	// Answer is the solution, or Code the terminal error code, that polls
	// report once the task is ready.
	Answer string
	Code   string
	// Ready reports whether polls report the outcome already.
	Ready bool
	// Reports counts reportbad/reportgood requests naming the task.
	Reports int
}

func (t *task) snapshot() Task {
	c := t.Task
	c.Params = cloneValues(t.Params)
	c.Image = slices.Clone(t.Image)
	c.Reports = int(t.reportCount)
	return c
}

func cloneValues(v url.Values) url.Values {
	if v == nil {
		return nil
	}
	c := make(url.Values, len(v))
	for k, vs := range v {
		c[k] = slices.Clone(vs)
	}
	return c
}

func newServer(opts []Option) *Server {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	pbTrans := &http.Transport{
		Proxy:             nil, // pingbacks go to loopback receivers, never through a proxy
		DialContext:       (&net.Dialer{Timeout: PingbackTimeout}).DialContext,
		DisableKeepAlives: true,
	}
	s := &Server{
		URL:        InProcessURL,
		cfg:        cfg,
		idBase:     10_000_000_000 + rand.Uint64N(80_000_000_000),
		tasks:      make(map[string]*task),
		unsolved:   make(map[string]map[string]*task),
		submitsFor: make(map[string]int64),
		timers:     make(map[string]*time.Timer),
		done:       make(chan struct{}),
		ctx:        ctx,
		cancel:     cancel,
		pbTrans:    pbTrans,
		pbClient: &http.Client{
			Transport: pbTrans,
			Timeout:   PingbackTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
	}
	s.latency.Store(int64(cfg.latency))
	return s
}

// NewServer starts a fake on a loopback port (127.0.0.1) and registers
// t.Cleanup(s.Close).
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := Start("127.0.0.1:0", opts...)
	if err != nil {
		t.Fatalf("captchaaitest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// NewInProcess makes a fake that listens nowhere: reach it through
// s.Transport() (s.URL is InProcessURL). Use it inside testing/synctest
// bubbles, where a listening socket would keep fake time from advancing;
// create it inside the bubble, since its waits select on channels it makes.
// It registers t.Cleanup(s.Close).
func NewInProcess(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := newServer(opts)
	t.Cleanup(s.Close)
	return s
}

// Start starts a fake without a testing.TB (cmd/fakecaptchaai, load tests);
// addr "" means 127.0.0.1:0. The caller must Close it.
func Start(addr string, opts ...Option) (*Server, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("captchaaitest: listen on %s: %w", addr, err)
	}
	s := newServer(opts)
	s.URL = "http://" + ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.connWG.Add(1)
			case http.StateHijacked, http.StateClosed:
				s.connWG.Done()
			}
		},
	}
	s.serveDone = make(chan struct{})
	go func() {
		defer close(s.serveDone)
		_ = s.srv.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return s, nil
}

// Close stops the server: the listener and every connection are closed,
// hanging and delayed requests end, timers stop, pingback deliveries are
// cancelled, and Close returns once everything the Server started has
// finished. Close is idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		for id, t := range s.timers {
			t.Stop()
			delete(s.timers, id)
		}
		s.mu.Unlock()
		close(s.done)
		s.cancel()
		if s.srv != nil {
			_ = s.srv.Close() // the only error is the listener's close error
			<-s.serveDone
		}
		s.wg.Wait()
		s.connWG.Wait()
		s.pbTrans.CloseIdleConnections()
	})
}

// enter registers one unit of work; it fails once the Server is closed.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// errClosed ends requests that were waiting when the Server closed.
var errClosed = errors.New("captchaaitest: server closed")

// wait sleeps d unless ctx is done or the Server closes first.
func (s *Server) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("captchaaitest: request abandoned: %w", ctx.Err())
	case <-s.done:
		return errClosed
	}
}

// Handler returns the protocol handler itself. Network-level faults need a
// connection that can be hijacked; without one (httptest.ResponseRecorder)
// the handler panics with http.ErrAbortHandler instead.
func (s *Server) Handler() http.Handler { return handler{s} }

// Submits returns the number of in.php requests that created a task
// (including those that created one and then failed ambiguously).
func (s *Server) Submits() int64 { return s.submits.Load() }

// SubmitRequests returns the number of in.php requests that reached the
// handler, whatever their outcome (faulted ones included; requests refused
// by an outage are not included).
func (s *Server) SubmitRequests() int64 { return s.submitRequests.Load() }

// Polls returns the number of res.php action=get requests (single id or
// ids=), faulted ones included.
func (s *Server) Polls() int64 { return s.polls.Load() }

// Requests returns the number of all requests, including those refused by
// an outage.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Refused returns the number of requests refused by an outage.
func (s *Server) Refused() int64 { return s.refused.Load() }

// Reports returns the number of reportbad/reportgood requests, faulted ones
// included.
func (s *Server) Reports() int64 { return s.reports.Load() }

// Pingbacks returns the number of pingback deliveries started.
func (s *Server) Pingbacks() int64 { return s.pingbacks.Load() }

// SubmitsFor returns the number of tasks created for a fingerprint
// (captchaai.Request.Fingerprint()).
func (s *Server) SubmitsFor(fingerprint string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.submitsFor[fingerprint]
}

// PollsFor returns the number of res.php action=get requests naming taskID
// (in id= or ids=), by any key, faulted ones included; 0 for a task the
// Server does not hold.
func (s *Server) PollsFor(taskID string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tasks[taskID]; t != nil {
		return t.pollRequests
	}
	return 0
}

// Tasks returns a snapshot of every task held, oldest first.
func (s *Server) Tasks() []Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Task, 0, len(s.order)-s.head)
	for _, id := range s.order[s.head:] {
		if t := s.tasks[id]; t != nil {
			out = append(out, t.snapshot())
		}
	}
	return out
}

// Task returns a snapshot of one task.
func (s *Server) Task(id string) (Task, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[id]
	if t == nil {
		return Task{}, false
	}
	return t.snapshot(), true
}

// newID returns a fresh 11-digit task ID.
func (s *Server) newID() string {
	return strconv.FormatUint(s.idBase+s.idSeq.Add(1), 10)
}

// readyLocked reports whether t is ready at now, marking it so (and
// starting its pingback) the first time. s.mu must be held.
func (s *Server) readyLocked(t *task, now time.Time) bool {
	if t.Ready {
		return true
	}
	if s.cfg.timeBased {
		if now.Before(t.Submitted.Add(s.cfg.solveAfter)) {
			return false
		}
	} else if t.Polls < s.cfg.solvePolls {
		return false
	}
	t.Ready = true
	if m := s.unsolved[t.Key]; m != nil {
		delete(m, t.ID)
		if len(m) == 0 {
			delete(s.unsolved, t.Key)
		}
	}
	if tm := s.timers[t.ID]; tm != nil {
		tm.Stop()
		delete(s.timers, t.ID)
	}
	s.pingbackLocked(t)
	return true
}

// unsolvedLocked counts key's tasks that are not ready at now.
func (s *Server) unsolvedLocked(key string, now time.Time) int {
	n := 0
	for _, t := range s.unsolved[key] {
		if !s.readyLocked(t, now) {
			n++
		}
	}
	return n
}

// insertLocked stores a new task, forgetting the oldest beyond Retain.
func (s *Server) insertLocked(t *task) {
	s.tasks[t.ID] = t
	s.order = append(s.order, t.ID)
	if !t.Ready {
		m := s.unsolved[t.Key]
		if m == nil {
			m = make(map[string]*task)
			s.unsolved[t.Key] = m
		}
		m[t.ID] = t
	}
	for len(s.order)-s.head > s.cfg.retain {
		s.forgetLocked(s.order[s.head])
		s.order[s.head] = ""
		s.head++
	}
	if s.head > 1024 && s.head > len(s.order)/2 {
		s.order = slices.Clone(s.order[s.head:])
		s.head = 0
	}
}

func (s *Server) forgetLocked(id string) {
	t := s.tasks[id]
	if t == nil {
		return
	}
	delete(s.tasks, id)
	if m := s.unsolved[t.Key]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(s.unsolved, t.Key)
		}
	}
	if tm := s.timers[id]; tm != nil {
		tm.Stop()
		delete(s.timers, id)
	}
}
