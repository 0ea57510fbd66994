package shared

import (
	"context"
	"time"

	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/captchaai"
)

// Tiered is the answer cache of a replica that shares answers: the
// replica's in-memory cache first, Redis second. It satisfies
// intercept.AnswerCache.
//
// Get asks memory, then Redis; an answer found in Redis is copied into
// memory for the time it has left there, so a hot task costs Redis one
// read per replica. Put writes both levels with one TTL: the caller's, or,
// for 0, the memory level's configured DoneTTL (terminal answers) or
// PendingTTL (CAPCHA_NOT_READY). AnswerCache methods take no context, so
// every Redis call is bounded by the Redis level's timeout alone.
type Tiered struct {
	l1 *cache.Answers
	l2 *Answers
}

// NewTiered returns the cache reading l1, then l2.
func NewTiered(l1 *cache.Answers, l2 *Answers) *Tiered {
	return &Tiered{l1: l1, l2: l2}
}

// Get returns the answer cached under key in either level.
func (t *Tiered) Get(key string) (captchaai.Answer, bool) {
	if a, ok := t.l1.Get(key); ok {
		return a, true
	}
	a, ttl, ok := t.l2.Get(context.Background(), key)
	if !ok {
		return captchaai.Answer{}, false
	}
	if ttl > 0 {
		t.l1.Put(key, a, ttl)
	}
	return a, true
}

// Put stores a under key in both levels for ttl (0: the memory level's
// default for the kind of answer). Answers that are neither terminal nor
// CAPCHA_NOT_READY are not cached, as in memory. It reports whether either
// level took the answer.
func (t *Tiered) Put(key string, a captchaai.Answer, ttl time.Duration) bool {
	if ttl <= 0 {
		cfg := t.l1.Config()
		switch {
		case a.Terminal():
			ttl = cfg.DoneTTL
		case a.Status == captchaai.StatusNotReady:
			ttl = cfg.PendingTTL
		default:
			return false
		}
	}
	in1 := t.l1.Put(key, a, ttl)
	in2 := t.l2.Put(context.Background(), key, a, ttl)
	return in1 || in2
}
