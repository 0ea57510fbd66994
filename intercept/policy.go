package intercept

import (
	"encoding/json"
	"fmt"
	"time"
)

// Reuse says when an existing task may be handed to a new identical
// submission.
type Reuse uint8

const (
	// ReuseAlways shares a task with every identical submission within the
	// window: right for answers that are facts (image text).
	ReuseAlways Reuse = iota
	// ReuseOrphans hands a task over only when nobody can be using it: its
	// submit answer never reached a client, or its client went silent
	// (no poll for OrphanAfter) and no client has received its answer.
	// Right for single-use tokens (reCAPTCHA, hCaptcha, Turnstile, …).
	ReuseOrphans
	// ReuseNever forwards every submission.
	ReuseNever
)

var reuseNames = [...]string{"always", "orphans", "never"}

// String returns "always", "orphans" or "never".
func (r Reuse) String() string {
	if int(r) < len(reuseNames) {
		return reuseNames[r]
	}
	return fmt.Sprintf("reuse(%d)", r)
}

// UnmarshalText parses "always", "orphans" or "never".
func (r *Reuse) UnmarshalText(b []byte) error {
	for i, n := range reuseNames {
		if string(b) == n {
			*r = Reuse(i)
			return nil
		}
	}
	return fmt.Errorf("reuse must be \"always\", \"orphans\" or \"never\", not %q", b)
}

// MarshalText returns the name.
func (r Reuse) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Policy says when a new identical submission may be handed an existing
// task, for one method family.
type Policy struct {
	Reuse Reuse `toml:"reuse"`
	// Window is how long after submission a task can be handed out at all;
	// 0 → 10m for always, 80s for orphans.
	Window time.Duration `toml:"window"`
	// OrphanAfter (orphans only) is the silence after which a delivered
	// task whose answer nobody received is free again; 0 → 30s.
	OrphanAfter time.Duration `toml:"orphan_after"`
	// AnswerTTL is how long a solved answer is cached for polls of the
	// task; 0 → the cache's done_ttl for always, Window for orphans (a
	// token is worthless after its lifetime).
	AnswerTTL time.Duration `toml:"answer_ttl"`
}

func (p Policy) withDefaults() Policy {
	if p.Window <= 0 {
		if p.Reuse == ReuseOrphans {
			p.Window = 80 * time.Second
		} else {
			p.Window = 10 * time.Minute
		}
	}
	if p.OrphanAfter <= 0 {
		p.OrphanAfter = 30 * time.Second
	}
	if p.AnswerTTL <= 0 && p.Reuse == ReuseOrphans {
		p.AnswerTTL = p.Window
	}
	return p
}

// DefaultPolicies returns the built-in policy table (protocol doc §2.3, §7):
// image-like answers are facts and always shared; single-use tokens are
// shared only as orphans, within their lifetime minus a safety margin.
func DefaultPolicies() map[string]Policy {
	always := func(w time.Duration) Policy { return Policy{Reuse: ReuseAlways, Window: w} }
	orphans := func(w time.Duration) Policy {
		return Policy{Reuse: ReuseOrphans, Window: w, OrphanAfter: 30 * time.Second}
	}
	return map[string]Policy{
		"image":                always(10 * time.Minute),
		"bls":                  always(10 * time.Minute),
		"geetest":              always(60 * time.Second),
		"cloudflare_challenge": always(10 * time.Minute),
		"userrecaptcha":        orphans(80 * time.Second),
		"hcaptcha":             orphans(80 * time.Second),
		"turnstile":            orphans(250 * time.Second),
		"geetest_v4":           orphans(60 * time.Second),
		"friendly_captcha":     orphans(80 * time.Second),
		"lemin":                orphans(80 * time.Second),
		"captchafox":           orphans(80 * time.Second),
		"funcaptcha":           orphans(80 * time.Second),
	}
}

// hold says who may be using a task.
type hold uint8

const (
	holdWaiting   hold = iota // a client is waiting for the submit answer
	holdFree                  // no client holds it: its submit answer never reached anyone
	holdDelivered             // a client got the task ID (alive while it polls)
	holdFetched               // a client received the answer: never handed out again
)

// entry is what the index keeps per fingerprint (JSON in the store).
type entry struct {
	Pending bool            `json:"p,omitempty"` // claimed, task not yet known
	Failed  bool            `json:"x,omitempty"` // the claim's upstream call failed
	Owner   string          `json:"o,omitempty"` // claim owner (replica + nonce)
	Task    string          `json:"t,omitempty"` // upstream task ID
	IDJSON  json.RawMessage `json:"j,omitempty"` // task ID as upstream sent it in JSON
	Code    string          `json:"c,omitempty"` // error code when Failed
	Hold    hold            `json:"h"`
	Created int64           `json:"n"` // unix ms
	Touched int64           `json:"s"` // unix ms of the last sign of life
	Window  int64           `json:"w"` // ms after Created during which the task may be handed out
	Payload string          `json:"d,omitempty"`
	// Pingback is a hash of the pingback URL CaptchaAI itself will call
	// for this task (the creating submission's), so solveonce does not
	// call it a second time for a merged submission.
	Pingback string `json:"b,omitempty"`
}

// action is what a submission does after looking at the index.
type action uint8

const (
	actLead        action = iota // we claimed it: submit upstream
	actReuse                     // hand out the existing task
	actWait                      // another replica is submitting it: wait
	actIndependent               // the slot is held by a live consumer: submit without indexing
	actMismatch                  // Idempotency-Key reused with another payload
)

// decision is decide's verdict.
type decision struct {
	act   action
	entry entry // the entry after the decision
}

// decide is the whole reuse policy, a pure function of the current entry,
// the policy and the time. It returns the entry to store (write true) or
// no change (write false); the caller picks the TTL.
func decide(cur entry, ok bool, pol Policy, payload, me string, now time.Time, fresh bool) (d decision, next entry, write bool) {
	ms := now.UnixMilli()
	claim := entry{Pending: true, Owner: me, Hold: holdWaiting, Created: ms, Touched: ms, Window: pol.Window.Milliseconds(), Payload: payload}
	lead := func() (decision, entry, bool) {
		return decision{act: actLead, entry: claim}, claim, true
	}
	if !ok || cur.Failed || fresh {
		return lead()
	}
	if payload != "" && cur.Payload != "" && cur.Payload != payload {
		return decision{act: actMismatch, entry: cur}, cur, false
	}
	age := time.Duration(ms-cur.Created) * time.Millisecond
	silent := time.Duration(ms-cur.Touched) * time.Millisecond
	if cur.Pending {
		if pol.Reuse == ReuseAlways || cur.Hold == holdFree {
			if pol.Reuse == ReuseOrphans {
				cur.Hold, cur.Touched = holdWaiting, ms
				return decision{act: actWait, entry: cur}, cur, true
			}
			return decision{act: actWait, entry: cur}, cur, false
		}
		return decision{act: actIndependent, entry: cur}, cur, false
	}
	if age >= pol.Window {
		return lead()
	}
	if pol.Reuse == ReuseAlways {
		return decision{act: actReuse, entry: cur}, cur, false
	}
	switch {
	case cur.Hold == holdFetched:
		return lead()
	case cur.Hold == holdFree,
		(cur.Hold == holdDelivered || cur.Hold == holdWaiting) && silent >= pol.OrphanAfter:
		cur.Hold, cur.Touched = holdWaiting, ms
		return decision{act: actReuse, entry: cur}, cur, true
	}
	// A live consumer holds it: give this submission its own task, and
	// index that one instead (the held task is delivered already).
	return lead()
}
