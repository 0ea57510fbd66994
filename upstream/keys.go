package upstream

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"golang.org/x/time/rate"
)

// maxKeys bounds the per-key state kept; beyond it idle keys are dropped
// first, then any key not in use.
const maxKeys = 50_000

// sweepEvery is how often idle per-key state is looked for.
const sweepEvery = time.Minute

// keyState is what the Client remembers about one API key.
type keyState struct {
	account string        // AccountOf(key), for logs
	lim     *rate.Limiter // per-key limit; nil when unlimited

	// Guarded by keys.mu.
	lastUsed    time.Time
	users       int               // calls currently holding this state
	goodUntil   time.Time         // CaptchaAI accepted the key recently: calls flow freely
	bad         *captchaai.Answer // CaptchaAI rejected the key; answered locally until badUntil
	badUntil    time.Time
	pausedUntil time.Time // CaptchaAI announced a pause for the key
	pauseCode   string
	probe       chan struct{} // closed when the call vetting an unverified key ends
}

// keys is the per-key table: bad-key memory, throttle pauses, the gate
// that lets one call vet an unknown key, and per-key limiters.
type keys struct {
	ttl    time.Duration
	keyLim rate.Limit
	keyBur int

	mu        sync.Mutex // guards m, nextSweep and the guarded fields of every keyState
	m         map[string]*keyState
	nextSweep time.Time
}

func newKeys(cfg Config) *keys {
	return &keys{ttl: cfg.BadKeyTTL, keyLim: limit(cfg.KeyRate), keyBur: cfg.KeyBurst, m: make(map[string]*keyState)}
}

// admission is what admit decided for one call.
type admission struct {
	ks    *keyState
	probe chan struct{}     // non-nil: this call vets the key (the gate it holds)
	local *captchaai.Answer // answer locally with this (remembered bad key)
	err   error             // refuse with this (paused, rate limited, caller gone)
}

// admit decides whether a call with key may go upstream. A key CaptchaAI
// rejected is answered locally; a paused key is refused; a key not seen
// answered within ttl lets one call through to vet it while the others wait
// (up to maxWait) for its verdict. Every admission with a non-nil ks must
// be ended with release.
func (k *keys) admit(ctx context.Context, key string, maxWait time.Duration) admission {
	var deadline <-chan time.Time
	for {
		k.mu.Lock()
		now := time.Now()
		ks := k.getLocked(key, now)
		switch {
		case now.Before(ks.badUntil):
			a := *ks.bad
			k.mu.Unlock()
			return admission{local: &a}
		case now.Before(ks.pausedUntil):
			after, code := ks.pausedUntil.Sub(now), ks.pauseCode
			k.mu.Unlock()
			return admission{err: &refusal{kind: ErrPaused, detail: code + ", account " + ks.account, after: after}}
		case now.Before(ks.goodUntil):
			ks.users++
			k.mu.Unlock()
			return admission{ks: ks}
		case ks.probe == nil:
			ch := make(chan struct{})
			ks.probe = ch
			ks.users++
			k.mu.Unlock()
			return admission{ks: ks, probe: ch}
		}
		ch := ks.probe
		k.mu.Unlock()

		if deadline == nil {
			t := time.NewTimer(maxWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-ch:
		case <-deadline:
			return admission{err: &refusal{kind: ErrRateLimited, detail: "waiting for the first answer of a new key", after: minRetryAfter}}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return admission{err: ctx.Err()}
			}
			return admission{err: &refusal{kind: ErrRateLimited, detail: "waiting for the first answer of a new key", cause: ctx.Err(), after: minRetryAfter}}
		}
	}
}

// getLocked returns the state of key, creating it.
func (k *keys) getLocked(key string, now time.Time) *keyState {
	ks := k.m[key]
	if ks == nil {
		if len(k.m) >= maxKeys || now.After(k.nextSweep) {
			k.sweepLocked(now)
		}
		ks = &keyState{account: captchaai.AccountOf(key)}
		if k.keyLim != rate.Inf {
			ks.lim = rate.NewLimiter(k.keyLim, k.keyBur)
		}
		k.m[key] = ks
	}
	ks.lastUsed = now
	return ks
}

// idleLocked reports whether forgetting ks changes nothing: nobody uses it,
// nothing is remembered, and its limiter has refilled.
func (k *keys) idleLocked(ks *keyState, now time.Time) bool {
	if ks.users > 0 || ks.probe != nil || now.Before(ks.goodUntil) || now.Before(ks.badUntil) || now.Before(ks.pausedUntil) {
		return false
	}
	return ks.lim == nil || ks.lim.TokensAt(now) >= float64(ks.lim.Burst())
}

// sweepLocked drops idle keys; if the table is still full, it drops keys
// nobody is using, good ones first, so the table stays bounded.
func (k *keys) sweepLocked(now time.Time) {
	k.nextSweep = now.Add(sweepEvery)
	for key, ks := range k.m {
		if k.idleLocked(ks, now) {
			delete(k.m, key)
		}
	}
	for pass := 0; pass < 2 && len(k.m) >= maxKeys; pass++ {
		for key, ks := range k.m {
			if len(k.m) < maxKeys*9/10 {
				return
			}
			if ks.users == 0 && ks.probe == nil && (pass == 1 || ks.bad == nil) {
				delete(k.m, key)
			}
		}
	}
}

// settle records what CaptchaAI's protocol answer a says about the key:
// an account or ban answer marks it bad (returns true the first time, for
// logging); any other answer marks it good. A throttle answer also pauses
// it (returns the pause).
func (k *keys) settle(ks *keyState, a captchaai.Answer) (nowBad bool, pause time.Duration) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	switch class := captchaai.Classify(a.Value); {
	case a.Status == captchaai.StatusError && (class == captchaai.ClassAccount || class == captchaai.ClassBanned):
		ttl := k.ttl
		if class == captchaai.ClassBanned {
			ttl = max(ttl, captchaai.Pause(a.Value))
		}
		nowBad = !now.Before(ks.badUntil)
		kept := keepAnswer(a)
		ks.bad, ks.badUntil, ks.goodUntil = &kept, now.Add(ttl), time.Time{}
	case a.Status == captchaai.StatusError && class == captchaai.ClassThrottle:
		ks.goodUntil = now.Add(k.ttl)
		if p := captchaai.Pause(a.Value); p > 0 && now.Add(p).After(ks.pausedUntil) {
			ks.pausedUntil, ks.pauseCode, pause = now.Add(p), a.Value, p
		}
	default:
		ks.goodUntil = now.Add(k.ttl)
	}
	k.openGateLocked(ks, ks.probe)
	return nowBad, pause
}

// release ends an admission: it drops the user count and, if the call was
// vetting the key without reaching a verdict, lets the next waiter try.
func (k *keys) release(ad admission) {
	if ad.ks == nil {
		return
	}
	k.mu.Lock()
	ad.ks.users--
	if ad.probe != nil {
		k.openGateLocked(ad.ks, ad.probe)
	}
	k.mu.Unlock()
}

// openGateLocked lets the calls waiting on gate go on, if gate is still
// the key's current gate.
func (k *keys) openGateLocked(ks *keyState, gate chan struct{}) {
	if gate != nil && ks.probe == gate {
		close(gate)
		ks.probe = nil
	}
}

// keepAnswer copies the parts of a worth remembering (not the caller's
// buffers beyond the body, which is copied).
func keepAnswer(a captchaai.Answer) captchaai.Answer {
	a.Raw = append([]byte(nil), a.Raw...)
	a.JSONValue = append([]byte(nil), a.JSONValue...)
	if len(a.JSONValue) == 0 {
		a.JSONValue = nil
	}
	return a
}

// localAnswer renders a remembered answer in the format the caller asked
// for, with the Content-Type CaptchaAI last used for that format.
func localAnswer(a captchaai.Answer, f captchaai.Format, contentType string) captchaai.Answer {
	if a.Format == f {
		return a
	}
	out := captchaai.Answer{
		Status:      a.Status,
		Value:       a.Value,
		JSONValue:   a.JSONValue,
		Raw:         a.Render(f),
		Format:      f,
		ContentType: contentType,
		Bare:        a.Bare,
		HTTPStatus:  a.HTTPStatus,
	}
	if f == captchaai.FormatText {
		out.JSONValue = nil
	}
	return out
}

// blocked reports whether a call already admitted must stop before its next
// attempt: the key went bad (answer locally) or got paused meanwhile.
func (k *keys) blocked(ks *keyState) (*captchaai.Answer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	switch {
	case now.Before(ks.badUntil):
		a := *ks.bad
		return &a, nil
	case now.Before(ks.pausedUntil):
		return nil, &refusal{kind: ErrPaused, detail: ks.pauseCode + ", account " + ks.account, after: ks.pausedUntil.Sub(now)}
	}
	return nil, nil
}
