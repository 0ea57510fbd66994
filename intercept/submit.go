package intercept

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/store"
)

// Submission is the result of Layer.Submit. Pass it back to Delivered once
// its answer has been written to the client.
type Submission struct {
	Answer  captchaai.Answer
	Outcome Outcome

	key     string // index key ("" when not indexed)
	task    string
	orphans bool
}

// Task returns the task ID handed out ("" when the answer is an error).
func (s *Submission) Task() string { return s.task }

// submitFlight is a flight plus what joining it requires.
type submitFlight struct {
	flight
	key     string
	payload string
	pol     Policy
	task    string
	indexed bool
	outcome Outcome // how the flight was resolved: Miss (led) or Replayed
	// pingback hashes the pingback URL CaptchaAI was (or will be) given
	// for the task: set before done is closed.
	pingback string
}

// Submit answers an in.php submission: from the index when an identical
// task may be reused, by joining an identical submission in flight, or by
// submitting upstream once on behalf of everyone waiting.
func (l *Layer) Submit(ctx context.Context, r *captchaai.Request) (*Submission, error) {
	l.Stats.Submits.Add(1)
	fs := l.Stats.Family(l.familyLabel(r))
	fs.Submits.Add(1)
	s, err := l.submit(ctx, r)
	if err == nil {
		switch s.Outcome {
		case Miss:
			fs.Upstream.Add(1)
		case Shared:
			fs.Shared.Add(1)
		case Replayed:
			fs.Replayed.Add(1)
		}
	}
	return s, err
}

// familyLabel is the family as a bounded label: a configured family, or
// "other".
func (l *Layer) familyLabel(r *captchaai.Request) string {
	f := string(r.Family())
	if _, ok := l.cfg.Policies[f]; ok {
		return f
	}
	return "other"
}

func (l *Layer) submit(ctx context.Context, r *captchaai.Request) (*Submission, error) {
	if !r.Understood || r.Key() == "" {
		return l.direct(ctx, r)
	}
	var key, payload string
	pol, ok := l.Policy(r.Family())
	if idem := r.Header.Get("Idempotency-Key"); idem != "" {
		sum := sha256.Sum256([]byte(idem))
		key = "i:" + r.Account() + ":" + hex.EncodeToString(sum[:16])
		payload = r.Fingerprint()
		pol = Policy{Reuse: ReuseAlways, Window: l.cfg.IdempotencyWindow}.withDefaults()
	} else {
		if !ok {
			return l.direct(ctx, r)
		}
		key = "f:" + r.Fingerprint()
	}
	fresh := noCache(r.Header.Values("Cache-Control"))

	l.mu.Lock()
	f := l.submits[key]
	if f != nil && !fresh && f.joinable(payload) {
		f.holders++
		l.mu.Unlock()
		return l.await(ctx, r, f, true)
	}
	f = &submitFlight{
		flight:  flight{done: make(chan struct{}), holders: 1},
		key:     key,
		payload: payload,
		pol:     pol,
	}
	if l.submits[key] == nil || fresh {
		l.submits[key] = f
	}
	l.work.Add(1)
	l.mu.Unlock()
	go l.runSubmit(context.WithoutCancel(ctx), f, r, fresh)
	return l.await(ctx, r, f, false)
}

// joinable reports whether a new identical submission may wait for this
// flight. Guarded by Layer.mu.
func (f *submitFlight) joinable(payload string) bool {
	if f.payload != payload {
		return f.payload != "" && payload != "" // let the flight report the mismatch
	}
	return f.pol.Reuse == ReuseAlways || f.holders == 0
}

// await waits for f on the caller's context.
func (l *Layer) await(ctx context.Context, r *captchaai.Request, f *submitFlight, joined bool) (*Submission, error) {
	if joined && f.payload != "" {
		if p := r.Fingerprint(); p != f.payload {
			l.leave(f)
			return nil, ErrIdempotencyMismatch
		}
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		l.leave(f)
		return nil, fmt.Errorf("intercept: submit: %w", ctx.Err())
	}
	if f.err != nil {
		return nil, f.err
	}
	out := f.outcome
	switch {
	case joined && out == Miss:
		out = Shared
		l.Stats.SubmitsShared.Add(1)
	case out == Replayed:
		l.Stats.SubmitsReplayed.Add(1)
	}
	s := &Submission{Answer: f.ans, Outcome: out, orphans: f.pol.Reuse == ReuseOrphans}
	if f.ans.Status == captchaai.StatusOK {
		s.task = f.task
		if f.indexed {
			s.key = f.key
		}
		l.subscribe(ctx, r, s, f.pingback)
	}
	return s, nil
}

// subscribe hands a merged submission's pingback to the Pingbacks: the
// submission that created the task went upstream with its own pingback,
// but CaptchaAI never saw this one.
func (l *Layer) subscribe(ctx context.Context, r *captchaai.Request, s *Submission, upstreamPingback string) {
	if l.pings == nil || s.Outcome == Miss {
		return
	}
	u := r.Params.Get("pingback")
	if u == "" || pingbackHash(u) == upstreamPingback {
		return // none, or CaptchaAI calls this very URL itself
	}
	l.pings.Subscribe(ctx, Subscription{Key: r.Key(), Account: r.Account(), Task: s.task, Method: r.Method, URL: u})
}

// pingbackHash names a pingback URL without storing it ("" for none).
func pingbackHash(u string) string {
	if u == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(u))
	return hex.EncodeToString(sum[:8])
}

// leave records that a caller stopped waiting for f. When the last holder
// of an orphans submission leaves before its answer, the task becomes free
// for the next identical submission (the classic timeout-then-retry).
func (l *Layer) leave(f *submitFlight) {
	l.mu.Lock()
	f.holders--
	free := f.holders == 0 && f.owner != "" && f.pol.Reuse == ReuseOrphans
	owner := f.owner
	l.mu.Unlock()
	select {
	case <-f.done:
		return
	default:
	}
	if !free {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.updateEntry(ctx, f.key, func(e entry) (entry, bool) {
		if !e.Pending || e.Owner != owner {
			return e, false
		}
		e.Hold = holdFree
		return e, true
	})
}

// Delivered records that s's answer reached its client, so under the
// orphans policy the task is now in use. Call it after a successful write.
func (l *Layer) Delivered(ctx context.Context, s *Submission) {
	if s == nil || s.key == "" || !s.orphans {
		return
	}
	now := l.now().UnixMilli()
	l.updateEntry(ctx, s.key, func(e entry) (entry, bool) {
		if e.Task != s.task || e.Hold == holdFetched {
			return e, false
		}
		e.Hold, e.Touched = holdDelivered, now
		return e, true
	})
}

// runSubmit resolves one submission flight on a context no caller owns.
func (l *Layer) runSubmit(parent context.Context, f *submitFlight, r *captchaai.Request, fresh bool) {
	defer l.work.Done()
	ctx, cancel := context.WithTimeout(parent, l.cfg.LeaderTimeout)
	defer cancel()
	ans, err := l.resolve(ctx, f, r, fresh)
	l.mu.Lock()
	if l.submits[f.key] == f {
		delete(l.submits, f.key)
	}
	f.ans, f.err = ans, err
	close(f.done)
	l.mu.Unlock()
}

func (l *Layer) resolve(ctx context.Context, f *submitFlight, r *captchaai.Request, fresh bool) (captchaai.Answer, error) {
	for range 16 {
		d, err := l.decideStored(ctx, f.key, f.pol, f.payload, fresh)
		fresh = false
		if err != nil {
			l.Stats.StoreErrors.Add(1)
			l.log.Warn("index unavailable; deduplicating within this replica only", "err", err)
			d = decision{act: actIndependent}
		}
		switch d.act {
		case actMismatch:
			return captchaai.Answer{}, ErrIdempotencyMismatch
		case actReuse:
			f.task, f.indexed, f.outcome = d.entry.Task, true, Replayed
			f.pingback = d.entry.Pingback
			return l.taskAnswer(r, d.entry), nil
		case actWait:
			ans, done, err := l.waitOther(ctx, f.key, d.entry.Owner, r)
			if done {
				return ans, err
			}
			continue
		case actLead:
			l.mu.Lock()
			f.owner, f.indexed = d.entry.Owner, true
			l.mu.Unlock()
		case actIndependent:
		}
		return l.submitUpstream(ctx, f, r)
	}
	return l.submitUpstream(ctx, f, r)
}

// submitUpstream sends the submission and records its task.
func (l *Layer) submitUpstream(ctx context.Context, f *submitFlight, r *captchaai.Request) (captchaai.Answer, error) {
	var stopRenew func()
	if f.indexed {
		stopRenew = l.renewClaim(ctx, f.key, f.owner)
	}
	l.Stats.SubmitsUpstream.Add(1)
	f.pingback = pingbackHash(r.Params.Get("pingback"))
	ans, err := l.up.Submit(ctx, r)
	if stopRenew != nil {
		stopRenew()
	}
	f.outcome = Miss
	if err != nil || ans.Status != captchaai.StatusOK {
		if f.indexed {
			code := captchaai.CodeNoSlot
			if err == nil {
				code = ans.Value
			}
			l.failClaim(f.key, f.owner, code)
		}
		f.indexed = false
		return ans, err
	}
	f.task = ans.Value
	if ans.Format == captchaai.FormatJSON {
		l.mu.Lock()
		l.idTypes[r.Method] = len(ans.JSONValue) > 0 && ans.JSONValue[0] != '"'
		l.mu.Unlock()
	}
	if f.indexed {
		l.commit(ctx, f, r, ans)
	}
	return ans, nil
}

// commit records the task under the flight's claim, if the claim is still
// ours, and remembers which index entry the task belongs to.
func (l *Layer) commit(ctx context.Context, f *submitFlight, r *captchaai.Request, ans captchaai.Answer) {
	now := l.now().UnixMilli()
	l.mu.Lock()
	h := holdWaiting
	if f.holders <= 0 {
		h = holdFree
	}
	l.mu.Unlock()
	var idJSON json.RawMessage
	if ans.Format == captchaai.FormatJSON {
		idJSON = ans.JSONValue
	}
	ok := l.updateEntry(ctx, f.key, func(e entry) (entry, bool) {
		if !e.Pending || e.Owner != f.owner {
			return e, false
		}
		return entry{Task: ans.Value, IDJSON: idJSON, Hold: h, Created: now, Touched: now, Window: f.pol.Window.Milliseconds(), Payload: f.payload, Pingback: f.pingback}, true
	})
	if !ok {
		f.indexed = false
		return
	}
	l.rememberTask(ctx, r.Account(), ans.Value, taskRecord{Key: f.key, Orphans: f.pol.Reuse == ReuseOrphans, AnswerTTL: f.pol.AnswerTTL}, f.pol.Window)
}

// renewClaim keeps the claim's lease alive while the upstream call runs, so
// a replica that dies mid-call is replaced within ClaimTTL.
func (l *Layer) renewClaim(ctx context.Context, key, owner string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(l.cfg.ClaimTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				l.updateEntry(ctx, key, func(e entry) (entry, bool) {
					return e, e.Pending && e.Owner == owner
				})
			}
		}
	}()
	return func() { cancel(); <-done }
}

// failClaim replaces our claim with a short-lived failure marker, so that
// waiters on other replicas get the error and the next submission tries
// again.
func (l *Layer) failClaim(key, owner, code string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _, err := l.index.Update(ctx, key, func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		var e entry
		if !ok || json.Unmarshal(cur, &e) != nil || !e.Pending || e.Owner != owner {
			return nil, 0, store.Keep
		}
		e.Pending, e.Failed, e.Code = false, true, code
		b, _ := json.Marshal(e)
		return b, 5 * time.Second, store.Put
	})
	if err != nil {
		l.Stats.StoreErrors.Add(1)
	}
}

// waitOther waits for another replica's claim on key to resolve. done is
// true when the waited-for submission ended (ans/err are its outcome);
// false means: decide again.
func (l *Layer) waitOther(ctx context.Context, key, owner string, r *captchaai.Request) (ans captchaai.Answer, done bool, err error) {
	changed, cancel, err := l.index.Subscribe(ctx, key)
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		return captchaai.Answer{}, false, nil
	}
	defer cancel()
	deadline := time.NewTimer(l.cfg.ClaimTTL + time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(250 * time.Millisecond) // fallback if a notification is lost
	defer poll.Stop()
	for {
		e, ok, err := l.getEntry(ctx, key)
		switch {
		case err != nil:
			return captchaai.Answer{}, false, nil
		case !ok:
			return captchaai.Answer{}, false, nil
		case e.Failed && e.Owner == owner:
			return captchaai.Text(e.Code), true, nil
		case !e.Pending || e.Owner != owner:
			return captchaai.Answer{}, false, nil
		}
		select {
		case <-ctx.Done():
			return captchaai.Answer{}, true, fmt.Errorf("intercept: waiting for another replica: %w", ctx.Err())
		case <-deadline.C:
			return captchaai.Answer{}, false, nil
		case <-changed:
		case <-poll.C:
		}
	}
}

// direct sends a submission solveonce does not deduplicate.
func (l *Layer) direct(ctx context.Context, r *captchaai.Request) (*Submission, error) {
	l.Stats.SubmitsDirect.Add(1)
	l.Stats.SubmitsUpstream.Add(1)
	ans, err := l.up.Submit(ctx, r)
	if err != nil {
		return nil, err
	}
	return &Submission{Answer: ans, Outcome: Miss}, nil
}

// taskAnswer is the submit answer for an existing task, in the format the
// leader received it when that is known.
func (l *Layer) taskAnswer(r *captchaai.Request, e entry) captchaai.Answer {
	a := captchaai.OK(e.Task)
	if len(e.IDJSON) > 0 {
		a.JSONValue = e.IDJSON
	} else {
		l.mu.Lock()
		numeric := l.idTypes[r.Method]
		l.mu.Unlock()
		if numeric {
			a.JSONValue = json.RawMessage(e.Task)
		}
	}
	return a
}

// noCache reports whether Cache-Control asks for a fresh task.
func noCache(values []string) bool {
	for _, v := range values {
		for _, d := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(d), "no-cache") {
				return true
			}
		}
	}
	return false
}

// errStore marks index failures.
var errStore = errors.New("intercept: index")
