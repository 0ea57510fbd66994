package intercept

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/store"
)

// pollTimeout bounds one shared poll after its callers have left.
const pollTimeout = 30 * time.Second

// cacheKey names a task's answer in one format; answers are per account,
// so one API key can never read another's.
func cacheKey(acct, id string, f captchaai.Format) string {
	if f == captchaai.FormatJSON {
		return acct + ":" + id + ":j"
	}
	return acct + ":" + id + ":t"
}

// Result answers res.php?action=get for one task: from the answer cache
// when it can (solved answers, and CAPCHA_NOT_READY for the cache's pending
// TTL), otherwise with one upstream poll shared by every concurrent poller
// of the task.
func (l *Layer) Result(ctx context.Context, r *captchaai.Request) (captchaai.Answer, Outcome, error) {
	l.Stats.Polls.Add(1)
	if !r.Understood || r.Key() == "" || r.ID == "" || r.Kind != captchaai.KindResult {
		l.Stats.PollsUpstream.Add(1)
		ans, err := l.up.Result(ctx, r)
		return ans, Miss, err
	}
	acct := l.account(r)
	key := cacheKey(acct, r.ID, r.Format)
	if a, ok := l.answers.Get(key); ok {
		l.Stats.PollHits.Add(1)
		l.touch(acct, r.ID)
		return a, Hit, nil
	}
	other := captchaai.FormatText
	if r.Format == captchaai.FormatText {
		other = captchaai.FormatJSON
	}
	// CAPCHA_NOT_READY and error codes render exactly in either format; a
	// solution may carry extra fields, so a client of the other format asks
	// upstream once in its own.
	fallback, haveOther := l.answers.Get(cacheKey(acct, r.ID, other))
	if haveOther && fallback.Status != captchaai.StatusOK {
		l.Stats.PollHits.Add(1)
		l.touch(acct, r.ID)
		return fallback, Hit, nil
	}

	// One upstream poll per task, whatever the formats of its pollers:
	// CAPCHA_NOT_READY and error codes render exactly in either format.
	ans, out, err := l.sharedPoll(ctx, acct+":"+r.ID, acct, r)
	if err == nil && ans.Status == captchaai.StatusOK && ans.Format != r.Format {
		// A solution may carry extra fields only upstream can render: ask
		// once more in this client's format.
		own, _, err2 := l.sharedPoll(ctx, key, acct, r)
		if err2 == nil {
			return own, out, nil
		}
	}
	if err != nil && haveOther {
		return fallback, Hit, nil
	}
	return ans, out, err
}

// sharedPoll polls upstream once for every caller asking under fkey.
func (l *Layer) sharedPoll(ctx context.Context, fkey, acct string, r *captchaai.Request) (captchaai.Answer, Outcome, error) {
	l.mu.Lock()
	f, joined := l.polls[fkey]
	if !joined {
		f = &flight{done: make(chan struct{})}
		l.polls[fkey] = f
		l.work.Add(1)
		go l.runPoll(context.WithoutCancel(ctx), f, fkey, acct, r)
	}
	l.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return captchaai.Answer{}, Miss, fmt.Errorf("intercept: poll: %w", ctx.Err())
	}
	out := Miss
	if joined {
		out = Shared
		l.Stats.PollsShared.Add(1)
	}
	return f.ans, out, f.err
}

// runPoll is the one upstream poll of a task, shared by its callers.
func (l *Layer) runPoll(parent context.Context, f *flight, fkey, acct string, r *captchaai.Request) {
	defer l.work.Done()
	ctx, cancel := context.WithTimeout(parent, pollTimeout)
	defer cancel()
	ans, err := l.poll(ctx, cacheKey(acct, r.ID, r.Format), acct, r)
	l.mu.Lock()
	delete(l.polls, fkey)
	f.ans, f.err = ans, err
	close(f.done)
	l.mu.Unlock()
}

func (l *Layer) poll(ctx context.Context, key, acct string, r *captchaai.Request) (captchaai.Answer, error) {
	// Look again inside the flight: a poll that just finished may have
	// filled the cache between our Get and our flight.
	if a, ok := l.answers.Get(key); ok {
		return a, nil
	}
	t := l.lookupTask(ctx, acct, r.ID)
	l.touch(acct, r.ID)
	l.Stats.PollsUpstream.Add(1)
	ans, err := l.up.Result(ctx, r)
	if err != nil {
		return ans, err
	}
	switch {
	case ans.Status == captchaai.StatusNotReady:
		l.answers.Put(key, ans, 0)
	case ans.Status == captchaai.StatusOK:
		l.answers.Put(key, ans, t.AnswerTTL)
		if t.known && t.Orphans {
			l.markFetched(ctx, t.Key, r.ID)
		}
	case ans.Terminal():
		l.answers.Put(key, ans, 0)
		if t.known && ans.Value == captchaai.CodeUnsolvable {
			l.evict(ctx, t.Key, r.ID)
		}
	}
	return ans, nil
}

// touchEvery spaces the index writes that record polls, so polls stay
// cheap; it must stay well under any orphan_after (default 30s).
const touchEvery = 5 * time.Second

// touch records a sign of life of a task's client (orphans policy), at most
// once per touchEvery.
func (l *Layer) touch(acct, id string) {
	v, ok := l.tasks.Load(acct + ":" + id)
	if !ok {
		return
	}
	t := v.(*task)
	if !t.known || !t.Orphans {
		return
	}
	now := l.now().UnixMilli()
	last := t.touched.Load()
	if now-last < touchEvery.Milliseconds() || !t.touched.CompareAndSwap(last, now) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l.updateEntry(ctx, t.Key, func(e entry) (entry, bool) {
		if e.Task != id || e.Hold == holdFetched {
			return e, false
		}
		e.Touched = now
		if e.Hold == holdFree || e.Hold == holdWaiting {
			e.Hold = holdDelivered // it is being polled: its ID reached a client
		}
		return e, true
	})
}

// markFetched records that a client received the task's answer: under the
// orphans policy the task is never handed out again.
func (l *Layer) markFetched(ctx context.Context, key, id string) {
	l.updateEntry(ctx, key, func(e entry) (entry, bool) {
		if e.Task != id || e.Hold == holdFetched {
			return e, false
		}
		e.Hold = holdFetched
		return e, true
	})
}

// evict drops the index entry of a task that is dead or reported bad, so
// the next identical submission gets a fresh task.
func (l *Layer) evict(ctx context.Context, key, id string) {
	_, _, err := l.index.Update(ctx, key, func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		if !ok {
			return nil, 0, store.Keep
		}
		var e entry
		if err := json.Unmarshal(cur, &e); err != nil || e.Task != id {
			return nil, 0, store.Keep
		}
		return nil, 0, store.Delete
	})
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		return
	}
	l.Stats.Evictions.Add(1)
}

// Report forwards reportbad/reportgood once per task and action; repeats
// (N deduplicated clients reporting one shared task) get the remembered
// answer. reportbad also evicts the task from the index.
func (l *Layer) Report(ctx context.Context, r *captchaai.Request) (captchaai.Answer, Outcome, error) {
	l.Stats.Reports.Add(1)
	if !r.Understood || r.Key() == "" || r.ID == "" {
		ans, err := l.up.Forward(ctx, r)
		return ans, Miss, err
	}
	acct := r.Account()
	mark := "r:" + acct + ":" + r.ID + ":" + r.Action
	first := true
	_, _, err := l.index.Update(ctx, mark, func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) {
		first = !ok
		if ok {
			return nil, 0, store.Keep
		}
		return []byte{1}, time.Hour, store.Put
	})
	if err != nil {
		l.Stats.StoreErrors.Add(1)
		first = true
	}
	if !first {
		l.Stats.ReportsAbsorbed.Add(1)
		return captchaai.Answer{Status: captchaai.StatusEmpty, Raw: []byte{}, Format: r.Format}, Hit, nil
	}
	ans, err := l.up.Forward(ctx, r)
	if err != nil || ans.Status == captchaai.StatusError || ans.Status == captchaai.StatusRaw {
		// Not recorded upstream: let the next report through.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = l.index.Delete(dctx, mark)
		cancel()
		return ans, Miss, err
	}
	if r.Action == "reportbad" {
		if t := l.lookupTask(ctx, acct, r.ID); t.known {
			l.evict(ctx, t.Key, r.ID)
		}
	}
	return ans, Miss, nil
}

// Forward passes a request solveonce does not deduplicate straight through:
// getbalance (idempotent, retried), anything else once. ids= multi-gets go
// through unchanged too: their "a|b|CAPCHA_NOT_READY" body is not a
// single-answer shape.
func (l *Layer) Forward(ctx context.Context, r *captchaai.Request) (captchaai.Answer, Outcome, error) {
	var ans captchaai.Answer
	var err error
	if r.Understood && r.Kind == captchaai.KindBalance {
		ans, err = l.up.Result(ctx, r)
	} else {
		ans, err = l.up.Forward(ctx, r)
	}
	return ans, Miss, err
}
