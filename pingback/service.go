package pingback

import (
	"container/heap"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/intercept"
)

// Poller answers res.php polls; *intercept.Layer satisfies it, so the
// Service's polls share the answer cache and the upstream polls of clients.
type Poller interface {
	Result(ctx context.Context, r *captchaai.Request) (captchaai.Answer, intercept.Outcome, error)
}

// Stats are the Service's counters, updated atomically; read them at any
// time (metrics read them at scrape time).
type Stats struct {
	Subscribed   atomic.Int64 // merged submissions' pingbacks accepted
	Duplicates   atomic.Int64 // ignored: same task and URL already served or being served
	Refused      atomic.Int64 // refused by pingback.allow (or not an http(s) URL)
	Polls        atomic.Int64 // answer polls made through the layer
	Attempts     atomic.Int64 // delivery attempts
	Retries      atomic.Int64 // failed attempts scheduled to be tried again
	Delivered    atomic.Int64 // successful deliveries
	DeadLettered atomic.Int64 // subscribers put into the dead-letter queue
	Overflows    atomic.Int64 // of which: at once, because pingback.queue was full
	Replayed     atomic.Int64 // dead letters delivered by `solveonce dlq replay`
}

// pollTimeout bounds one answer poll.
const pollTimeout = 30 * time.Second

// lockWait is how long New waits for another process to release the file.
const lockWait = time.Second

// sweepEvery spaces the clean-ups of the delivered set.
const sweepEvery = time.Hour

// Service serves merged submissions' pingbacks. Create it with New, hand it
// to intercept.WithPingbacks, call Start with the Layer, and Shutdown when
// the proxy has stopped serving.
type Service struct {
	// Stats are the counters; see also Held and DeadLetters.
	Stats Stats

	cfg     Config
	log     *slog.Logger
	rule    *Rule
	send    *sender
	store   *Store
	control bool
	ctl     *controlServer
	rt      http.RoundTripper

	runCtx    context.Context    // cancelled to abort deliveries
	cancelRun context.CancelFunc // …at the end of a Shutdown
	pollCtx   context.Context    // cancelled to abort polls
	stopPolls context.CancelFunc // …when Shutdown starts
	wake      chan struct{}      // cap 1: the loop looks at its heaps again
	stop      chan struct{}      // closed by Shutdown: loop and pollers return
	pollq     chan *watch        // watches due for a poll
	jr        journal
	wg        sync.WaitGroup // loop, pollers, workers, journal
	workers   sync.WaitGroup // delivery workers only
	closed    chan struct{}  // closed when Shutdown has finished
	closeErr  error

	mu       sync.Mutex
	cond     *sync.Cond // on mu: a host became ready, or shutdown
	poller   Poller
	started  bool
	closing  bool
	held     int                    // subscribers accepted and not finished
	subs     map[string]struct{}    // keys of held subscribers
	watches  map[string]*watch      // account:task → watch awaiting an answer
	due      watchHeap              // watches not being polled, by next poll
	known    map[string]knownAnswer // account:task → answer, for late subscribers
	knownFIF []string               // insertion order of known, to bound it
	hosts    map[string]*hostQueue
	ready    []*hostQueue // hosts with queued jobs and a free slot, round robin
	queued   int          // jobs in host queues
	retry    jobHeap      // failed jobs waiting for their next attempt
}

// watch is a task whose answer some subscribers wait for.
type watch struct {
	acct, task, method string
	key                string // API key, in memory only: to poll
	jobs               []*job
	next, deadline     time.Time
	polling            bool
	index              int // in Service.due; -1 when not there
}

// job is one subscriber: one pingback URL of one task.
type job struct {
	acct, task, method, url string
	host                    string // host:port, the unit of the per-host cap
	k                       []byte // store key
	code                    string // answer or error code, once known
	subscribed, born        time.Time
	attempts                int
	lastErr                 string
	next                    time.Time // next attempt, while in Service.retry
	index                   int
}

type knownAnswer struct {
	code string
	at   time.Time
}

// hostQueue holds the jobs for one host:port.
type hostQueue struct {
	name     string
	jobs     []*job
	inflight int
	inReady  bool
}

// Option changes a Service built by New.
type Option func(*Service)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// WithTransport replaces the delivery transport, and with it the dial-time
// allow check (the URL check at subscription stays): for tests that cannot
// use the network.
func WithTransport(rt http.RoundTripper) Option { return func(s *Service) { s.rt = rt } }

// withoutControl disables the control socket (for tests in a synctest
// bubble, where a listener would block time).
func withoutControl() Option { return func(s *Service) { s.control = false } }

// New opens the dead-letter queue file of cfg (in dataDir, see
// Config.Path), dead-letters what a previous process left pending, and
// returns a Service. It fails when another solveonce holds the file.
func New(cfg Config, dataDir string, opts ...Option) (*Service, error) {
	cfg = cfg.WithDefaults()
	rule, err := ParseRule(cfg.Allow)
	if err != nil {
		return nil, fmt.Errorf("pingback.allow: %w", err)
	}
	path, err := cfg.Path(dataDir)
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:     cfg,
		log:     slog.Default(),
		rule:    rule,
		control: true,
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		pollq:   make(chan *watch, cfg.Queue),
		closed:  make(chan struct{}),
		subs:    make(map[string]struct{}),
		watches: make(map[string]*watch),
		known:   make(map[string]knownAnswer),
		hosts:   make(map[string]*hostQueue),
	}
	for _, o := range opts {
		o(s)
	}
	s.cond = sync.NewCond(&s.mu)
	s.send = newSender(cfg, rule, s.rt)
	s.runCtx, s.cancelRun = context.WithCancel(context.Background())
	s.pollCtx, s.stopPolls = context.WithCancel(s.runCtx)
	st, err := OpenStore(path, lockWait)
	if errors.Is(err, ErrLocked) {
		return nil, fmt.Errorf("%w (another solveonce with the same data_dir? give each process its own data_dir or pingback.dlq_path)", err)
	}
	if err != nil {
		return nil, err
	}
	s.store = st
	s.jr.init(st, s.log)
	if n, err := st.recoverPending(time.Now()); err != nil {
		s.log.Warn("pingback: could not recover the pending journal", "err", err)
	} else if n > 0 {
		s.log.Warn("pingback: subscribers of a process that did not shut down gracefully were dead-lettered", "count", n, "path", path)
	}
	if _, err := st.Sweep(time.Now()); err != nil {
		s.log.Warn("pingback: delivered-set clean-up failed", "err", err)
	}
	if s.control {
		ctl, err := listenControl(path, s)
		if err != nil {
			s.log.Warn("pingback: no control socket; `solveonce dlq` works only while solveonce is stopped", "err", err)
		} else {
			s.ctl = ctl
		}
	}
	return s, nil
}

// Start starts polling and delivering, polling through p (the Layer).
func (s *Service) Start(p Poller) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closing {
		return
	}
	s.started, s.poller = true, p
	s.wg.Add(2)
	go s.jr.run(&s.wg)
	go s.loop()
	for range s.cfg.Workers {
		s.wg.Add(1)
		go s.pollWorker()
		s.workers.Add(1)
		go s.deliverWorker()
	}
	s.kick()
}

// Held returns the number of subscribers waiting for an answer or a
// delivery.
func (s *Service) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// DeadLetters returns the number of entries in the dead-letter queue.
func (s *Service) DeadLetters() int64 { return s.store.Len() }

// Path returns the dead-letter queue file.
func (s *Service) Path() string { return s.store.Path() }

// Subscribe takes a merged submission's pingback (intercept.Pingbacks). It
// never waits for the network or a disk write (it reads the delivered set):
// journal records, and a subscriber beyond pingback.queue, are written in
// the background.
func (s *Service) Subscribe(_ context.Context, sub intercept.Subscription) {
	u, err := s.rule.CheckURL(sub.URL)
	if err != nil {
		s.Stats.Refused.Add(1)
		s.log.Warn("pingback refused", "account", sub.Account, "task", sub.Task, "host", hostOf(sub.URL), "reason", err)
		return
	}
	now := time.Now()
	j := &job{
		acct: sub.Account, task: sub.Task, method: sub.Method, url: sub.URL,
		host: strings.ToLower(u.Host), k: subKey(sub.Account, sub.Task, sub.URL),
		subscribed: now, index: -1,
	}
	if done, err := s.store.Delivered(j.k, now); err == nil && done {
		s.Stats.Duplicates.Add(1)
		return
	}
	sk := string(j.k)
	s.mu.Lock()
	if _, dup := s.subs[sk]; dup {
		s.mu.Unlock()
		s.Stats.Duplicates.Add(1)
		return
	}
	s.Stats.Subscribed.Add(1)
	if s.closing {
		// Too late for the background journal: write it now (this only
		// happens to a request that outlived the HTTP server's shutdown).
		s.mu.Unlock()
		j.lastErr = "solveonce was shutting down"
		s.bury([]*job{j})
		return
	}
	if s.held >= s.cfg.Queue {
		s.mu.Unlock()
		j.lastErr = "pingback.queue full"
		s.Stats.Overflows.Add(1)
		s.Stats.DeadLettered.Add(1)
		s.jr.add(jop{kind: jopBury, entry: j.entry(now)})
		s.log.Warn("pingback dead-lettered at once", "account", j.acct, "task", j.task, "host", j.host, "reason", j.lastErr)
		return
	}
	s.held++
	s.subs[sk] = struct{}{}
	s.jr.add(jop{kind: jopPending, entry: j.entry(time.Time{})})
	wk := sub.Account + ":" + sub.Task
	if a, ok := s.known[wk]; ok && now.Sub(a.at) < s.cfg.PollDeadline {
		j.code, j.born = a.code, now
		s.enqueueLocked(j)
		s.mu.Unlock()
		return
	}
	w := s.watches[wk]
	if w == nil {
		w = &watch{
			acct: sub.Account, task: sub.Task, method: sub.Method, key: sub.Key,
			next: now.Add(s.cfg.firstPoll(sub.Method)), deadline: now.Add(s.cfg.PollDeadline), index: -1,
		}
		s.watches[wk] = w
		heap.Push(&s.due, w)
		s.kick()
	}
	w.jobs = append(w.jobs, j)
	s.mu.Unlock()
}

// entry is j as a journal or dead-letter entry, failed at t.
func (j *job) entry(t time.Time) Entry {
	return Entry{
		ID: hex.EncodeToString(j.k), Account: j.acct, Task: j.task, Method: j.method, URL: j.url,
		Code: j.code, Attempts: j.attempts, LastError: j.lastErr, Subscribed: j.subscribed, Failed: t,
	}
}

// kick wakes the loop.
func (s *Service) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loop dispatches due polls and due retries, and cleans the delivered set.
func (s *Service) loop() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	nextSweep := time.Now().Add(sweepEvery)
	for {
		var expired []*job
		s.mu.Lock()
		now := time.Now()
		for len(s.due) > 0 && !s.due[0].next.After(now) {
			w := heap.Pop(&s.due).(*watch)
			if now.After(w.deadline) {
				delete(s.watches, w.acct+":"+w.task)
				for _, j := range w.jobs {
					j.lastErr = "no answer within pingback.poll_deadline"
				}
				expired = append(expired, w.jobs...)
				continue
			}
			w.polling = true
			s.pollq <- w // never blocks: at most pingback.queue watches exist
		}
		for len(s.retry) > 0 && !s.retry[0].next.After(now) {
			s.enqueueLocked(heap.Pop(&s.retry).(*job))
		}
		wait := time.Until(nextSweep)
		if len(s.due) > 0 {
			wait = min(wait, s.due[0].next.Sub(now))
		}
		if len(s.retry) > 0 {
			wait = min(wait, s.retry[0].next.Sub(now))
		}
		s.mu.Unlock()
		s.bury(expired)
		t.Reset(max(wait, 0))
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-t.C:
		}
		if now := time.Now(); !now.Before(nextSweep) {
			nextSweep = now.Add(sweepEvery)
			if n, err := s.store.Sweep(now); err != nil {
				s.log.Warn("pingback: delivered-set clean-up failed", "err", err)
			} else if n > 0 {
				s.log.Debug("pingback: forgot old deliveries", "count", n)
			}
		}
	}
}

// pollWorker polls due watches until Shutdown.
func (s *Service) pollWorker() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case w := <-s.pollq:
			s.poll(w)
		}
	}
}

// poll asks for w's answer once, through the Layer, in the plain format.
func (s *Service) poll(w *watch) {
	ctx, cancel := context.WithTimeout(s.pollCtx, pollTimeout)
	defer cancel()
	q := url.Values{"key": {w.key}, "action": {"get"}, "id": {w.task}}
	r := captchaai.Parse(http.MethodGet, "/res.php", q.Encode(), http.Header{}, nil)
	s.Stats.Polls.Add(1)
	ans, _, err := s.poller.Result(ctx, r)
	code, final, fatal, pause := interpret(ans, err)
	if err != nil {
		s.log.Debug("pingback: poll failed; polling again", "account", w.acct, "task", w.task,
			"err", strings.ReplaceAll(err.Error(), w.key, "<key>"))
	}
	var dead []*job
	s.mu.Lock()
	w.polling = false
	if s.closing {
		s.mu.Unlock()
		return // Shutdown dead-letters the watch
	}
	now := time.Now()
	wk := w.acct + ":" + w.task
	switch {
	case final:
		delete(s.watches, wk)
		s.rememberLocked(wk, code, now)
		for _, j := range w.jobs {
			j.code, j.born = code, now
			s.enqueueLocked(j)
		}
	case fatal != "":
		delete(s.watches, wk)
		for _, j := range w.jobs {
			j.lastErr = fatal
		}
		dead = w.jobs
	default:
		w.next = now.Add(max(s.cfg.PollInterval, pause))
		heap.Push(&s.due, w)
		s.kick()
	}
	s.mu.Unlock()
	s.bury(dead)
}

// interpret reads a poll's answer: final with the code to deliver (a
// solution or a terminal error), fatal with a reason to stop polling, or
// neither (poll again, not before pause).
func interpret(ans captchaai.Answer, err error) (code string, final bool, fatal string, pause time.Duration) {
	if err != nil {
		return "", false, "", 0
	}
	switch ans.Status {
	case captchaai.StatusOK:
		return ans.Value, true, "", 0
	case captchaai.StatusError:
		if ans.Terminal() {
			return ans.Value, true, "", 0
		}
		switch captchaai.Classify(ans.Value) {
		case captchaai.ClassAccount, captchaai.ClassRequest:
			return "", false, "polling the answer failed: " + ans.Value, 0
		}
		return "", false, "", captchaai.Pause(ans.Value)
	}
	return "", false, "", 0
}

// rememberLocked keeps a task's answer for subscribers that come late,
// bounded by pingback.queue entries.
func (s *Service) rememberLocked(wk, code string, now time.Time) {
	if _, ok := s.known[wk]; !ok {
		s.knownFIF = append(s.knownFIF, wk)
	}
	s.known[wk] = knownAnswer{code: code, at: now}
	for len(s.knownFIF) > s.cfg.Queue {
		delete(s.known, s.knownFIF[0])
		s.knownFIF = s.knownFIF[1:]
	}
}

// enqueueLocked queues j for delivery on its host.
func (s *Service) enqueueLocked(j *job) {
	hq := s.hosts[j.host]
	if hq == nil {
		hq = &hostQueue{name: j.host}
		s.hosts[j.host] = hq
	}
	hq.jobs = append(hq.jobs, j)
	s.queued++
	s.readyLocked(hq)
}

// readyLocked puts hq in the ready ring when it has work and a free slot.
func (s *Service) readyLocked(hq *hostQueue) {
	if !hq.inReady && len(hq.jobs) > 0 && hq.inflight < s.cfg.HostWorkers {
		hq.inReady = true
		s.ready = append(s.ready, hq)
		s.cond.Signal()
	}
}

// maxExpiredBatch bounds the expired jobs a worker collects before
// dead-lettering them.
const maxExpiredBatch = 256

// next waits for a job to deliver. It also returns jobs found past
// pingback.max_age before their turn, to be dead-lettered by the caller.
// ok is false when the worker should exit.
func (s *Service) next() (j *job, expired []*job, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		for len(s.ready) == 0 {
			if len(expired) > 0 {
				return nil, expired, true
			}
			if s.closing && s.queued == 0 {
				return nil, nil, false
			}
			s.cond.Wait()
		}
		hq := s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		hq.inReady = false
		j := hq.jobs[0]
		hq.jobs[0] = nil
		hq.jobs = hq.jobs[1:]
		s.queued--
		if time.Since(j.born) > s.cfg.MaxAge {
			if j.lastErr == "" {
				j.lastErr = "not attempted within pingback.max_age (receiver busy)"
			}
			expired = append(expired, j)
			s.readyLocked(hq)
			s.dropHostLocked(hq)
			if len(expired) >= maxExpiredBatch {
				return nil, expired, true
			}
			continue
		}
		hq.inflight++
		s.readyLocked(hq)
		return j, expired, true
	}
}

// dropHostLocked forgets an idle host.
func (s *Service) dropHostLocked(hq *hostQueue) {
	if len(hq.jobs) == 0 && hq.inflight == 0 && !hq.inReady {
		delete(s.hosts, hq.name)
	}
}

// deliverWorker delivers jobs until Shutdown has drained the queues.
func (s *Service) deliverWorker() {
	defer s.workers.Done()
	for {
		j, expired, ok := s.next()
		s.bury(expired)
		if !ok {
			return
		}
		if j != nil {
			s.attempt(j)
		}
	}
}

// attempt makes one delivery attempt of j and files the outcome.
func (s *Service) attempt(j *job) {
	if done, err := s.store.Delivered(j.k, time.Now()); err == nil && done {
		s.Stats.Duplicates.Add(1)
		s.finish(j, outcomeDone)
		return
	}
	s.Stats.Attempts.Add(1)
	j.attempts++
	err := s.send.send(s.runCtx, j.url, j.task, j.code)
	if err == nil {
		s.Stats.Delivered.Add(1)
		if err := s.store.MarkDelivered(j.k, time.Now().Add(s.cfg.DeliveredTTL)); err != nil {
			s.log.Warn("pingback: delivered, but could not record it", "account", j.acct, "task", j.task, "err", err)
		}
		s.finish(j, outcomeDone)
		return
	}
	var ae *attemptError
	if !errors.As(err, &ae) {
		ae = &attemptError{msg: err.Error()}
	}
	j.lastErr = ae.msg
	switch {
	case ae.refused:
		s.Stats.Refused.Add(1)
		s.log.Warn("pingback refused at dial time", "account", j.acct, "task", j.task, "host", j.host, "reason", ae.msg)
		s.finish(j, outcomeDone)
	case ae.retry:
		s.finish(j, outcomeRetry)
	default:
		s.finish(j, outcomeDead)
	}
}

type outcome uint8

const (
	outcomeDone  outcome = iota // delivered, or dropped for good
	outcomeRetry                // try again after a backoff, if time is left
	outcomeDead                 // dead-letter
)

// backoff is the wait after the n-th failed attempt: between half and all
// of min(cap, base·2^(n-1)).
func (c Config) backoff(n int) time.Duration {
	d := c.BackoffCap
	if n < 40 {
		d = min(c.BackoffCap, c.BackoffBase<<(n-1))
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// finish files the outcome of an attempt of j and frees its host slot.
func (s *Service) finish(j *job, o outcome) {
	s.mu.Lock()
	if hq := s.hosts[j.host]; hq != nil {
		hq.inflight--
		s.readyLocked(hq)
		s.dropHostLocked(hq)
	}
	if o == outcomeRetry {
		// The last attempt is made at max_age at the latest.
		now, end := time.Now(), j.born.Add(s.cfg.MaxAge)
		next := now.Add(s.cfg.backoff(j.attempts))
		if next.After(end) {
			next = end
		}
		if s.closing || !now.Before(end) {
			o = outcomeDead
		} else {
			s.Stats.Retries.Add(1)
			j.next = next
			heap.Push(&s.retry, j)
			s.kick()
		}
	}
	if o == outcomeDone {
		s.releaseLocked(j) // a dead one is released by bury, once on disk
	}
	if s.closing {
		s.cond.Broadcast() // workers may exit
	}
	s.mu.Unlock()
	switch o {
	case outcomeDone:
		s.jr.add(jop{kind: jopDone, entry: j.entry(time.Time{})})
	case outcomeDead:
		s.bury([]*job{j})
	}
}

// releaseLocked forgets a held subscriber.
func (s *Service) releaseLocked(j *job) {
	if _, ok := s.subs[string(j.k)]; ok {
		delete(s.subs, string(j.k))
		s.held--
	}
}

// bury dead-letters jobs (which must no longer be queued anywhere) and
// then releases them, so that a subscriber is held until it is on disk.
func (s *Service) bury(jobs []*job) {
	if len(jobs) == 0 {
		return
	}
	now := time.Now()
	entries := make([]Entry, len(jobs))
	for i, j := range jobs {
		entries[i] = j.entry(now)
	}
	s.Stats.DeadLettered.Add(int64(len(jobs)))
	err := s.store.Bury(entries...)
	s.mu.Lock()
	for _, j := range jobs {
		s.releaseLocked(j)
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Error("pingback: could not write the dead-letter queue; subscribers lost", "count", len(jobs), "err", err)
		return
	}
	for _, e := range entries {
		// Drop a pending record the background journal may write after
		// Bury removed it.
		s.jr.add(jop{kind: jopDone, entry: e})
	}
	for _, j := range jobs {
		s.log.Warn("pingback dead-lettered", "account", j.acct, "task", j.task, "host", j.host,
			"attempts", j.attempts, "reason", j.lastErr, "answer_known", j.code != "")
	}
}

// Shutdown stops polling, delivers what is queued until ctx is done, and
// dead-letters every subscriber not delivered by then (those still waiting
// for an answer at once), then closes the file. Nobody is lost to the
// deadline, so reaching it is not an error; errors are the file's. Call it
// after the proxy has stopped accepting requests. It is safe to call more
// than once.
func (s *Service) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		select {
		case <-s.closed:
			return s.closeErr
		case <-ctx.Done():
			return fmt.Errorf("pingback: shutdown: %w", ctx.Err())
		}
	}
	s.closing = true
	var dead []*job
	for _, w := range s.watches {
		for _, j := range w.jobs {
			j.lastErr = "solveonce stopped before the answer was known"
		}
		dead = append(dead, w.jobs...)
	}
	clear(s.watches)
	s.due = nil
	for _, j := range s.retry {
		dead = append(dead, j)
	}
	s.retry = nil
	s.cond.Broadcast()
	s.mu.Unlock()
	if s.ctl != nil {
		s.ctl.close() // no replays while the queues drain
	}
	close(s.stop)
	s.stopPolls()
	s.bury(dead)

	drained := make(chan struct{})
	go func() { s.workers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		s.log.Warn("pingback: shutdown deadline reached; undelivered subscribers go to the dead-letter queue")
		s.cancelRun() // abort attempts in flight: they are dead-lettered
	}
	// Whatever is still queued (no workers, or the deadline passed) is
	// dead-lettered; the workers then find nothing and exit.
	s.mu.Lock()
	var left []*job
	for _, hq := range s.hosts {
		for _, j := range hq.jobs {
			if j.lastErr == "" {
				j.lastErr = "solveonce stopped before delivering"
			}
		}
		left = append(left, hq.jobs...)
		hq.jobs = nil
	}
	s.queued = 0
	s.ready = nil
	s.cond.Broadcast()
	s.mu.Unlock()
	s.bury(left)
	<-drained
	s.cancelRun()
	s.jr.close()
	s.wg.Wait()
	s.jr.flush()
	s.send.close()
	err := s.store.Close()
	s.closeErr = err
	close(s.closed)
	return err
}

// busy reports whether subscriber k is being served (replays skip it).
func (s *Service) busy(k []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.subs[string(k)]
	return ok
}

// hostOf returns the host of a URL for logs ("?" when it has none).
func hostOf(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return "?"
}

// journal writes pending records in the background, in order, so Subscribe
// never waits for the disk.
type journal struct {
	st   *Store
	log  *slog.Logger
	mu   sync.Mutex
	ops  []jop
	done bool
	kick chan struct{}
	stop chan struct{}
}

func (j *journal) init(st *Store, log *slog.Logger) {
	j.st, j.log = st, log
	j.kick = make(chan struct{}, 1)
	j.stop = make(chan struct{})
}

// add queues op.
func (j *journal) add(op jop) {
	j.mu.Lock()
	if j.done {
		j.mu.Unlock()
		if op.kind == jopDone {
			return // nothing to undo after the final flush
		}
		j.log.Error("pingback: journal closed; record lost", "account", op.entry.Account, "task", op.entry.Task)
		return
	}
	j.ops = append(j.ops, op)
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// run writes queued operations until close.
func (j *journal) run(wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
			j.flush()
		}
	}
}

// flush writes every queued operation now.
func (j *journal) flush() {
	j.mu.Lock()
	ops := j.ops
	j.ops = nil
	j.mu.Unlock()
	if err := j.st.apply(ops); err != nil {
		j.log.Error("pingback: journal write failed", "ops", len(ops), "err", err)
	}
}

// close stops run; later adds are refused (after a final flush by the
// caller).
func (j *journal) close() {
	j.mu.Lock()
	if !j.done {
		j.done = true
		close(j.stop)
	}
	j.mu.Unlock()
}

// watchHeap orders watches by next poll.
type watchHeap []*watch

func (h watchHeap) Len() int           { return len(h) }
func (h watchHeap) Less(i, k int) bool { return h[i].next.Before(h[k].next) }
func (h watchHeap) Swap(i, k int) {
	h[i], h[k] = h[k], h[i]
	h[i].index, h[k].index = i, k
}
func (h *watchHeap) Push(x any) { w := x.(*watch); w.index = len(*h); *h = append(*h, w) }
func (h *watchHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// jobHeap orders jobs by next attempt.
type jobHeap []*job

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(i, k int) bool { return h[i].next.Before(h[k].next) }
func (h jobHeap) Swap(i, k int) {
	h[i], h[k] = h[k], h[i]
	h[i].index, h[k].index = i, k
}
func (h *jobHeap) Push(x any) { j := x.(*job); j.index = len(*h); *h = append(*h, j) }
func (h *jobHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	j.index = -1
	return j
}
