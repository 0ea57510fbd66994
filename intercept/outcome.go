package intercept

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Outcome says how a request was answered.
type Outcome uint8

const (
	// Miss: answered by CaptchaAI for this request.
	Miss Outcome = iota
	// Hit: answered from memory (answer cache, remembered report).
	Hit
	// Shared: joined another request's upstream call in flight.
	Shared
	// Replayed: a repeated submission handed an existing task.
	Replayed
)

var outcomeNames = [...]string{"miss", "hit", "shared", "replayed"}

// String returns "miss", "hit", "shared" or "replayed", the value of the
// X-Solveonce header.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "miss"
}

// ErrIdempotencyMismatch is returned when an Idempotency-Key is reused for
// a different submission (IETF Idempotency-Key draft: 422).
var ErrIdempotencyMismatch = errors.New("intercept: Idempotency-Key already used for a different submission")

// Stats are the Layer's counters. The zero value is ready; all fields are
// updated atomically and may be read at any time.
type Stats struct {
	Submits         atomic.Int64 // in.php requests seen
	SubmitsUpstream atomic.Int64 // in.php requests sent to CaptchaAI
	SubmitsShared   atomic.Int64 // joined an in-flight submission
	SubmitsReplayed atomic.Int64 // handed an existing task
	SubmitsDirect   atomic.Int64 // not deduplicated (unknown method, never policy, unparsable)
	Polls           atomic.Int64 // res.php action=get requests seen
	PollHits        atomic.Int64 // answered from the cache
	PollsShared     atomic.Int64 // joined an in-flight poll
	PollsUpstream   atomic.Int64 // sent to CaptchaAI
	Reports         atomic.Int64 // reportbad/reportgood seen
	ReportsAbsorbed atomic.Int64 // repeated reports answered locally
	Evictions       atomic.Int64 // tasks dropped from the index (unsolvable, reportbad)
	StoreErrors     atomic.Int64 // store operations that failed (dedup fell back to this replica)

	families sync.Map // captchaai.Family → *FamilyStats
}

// FamilyStats counts the submissions of one method family.
type FamilyStats struct {
	Submits  atomic.Int64 // in.php requests seen
	Upstream atomic.Int64 // sent to CaptchaAI
	Shared   atomic.Int64 // joined a submission in flight
	Replayed atomic.Int64 // handed an existing task
}

// Family returns the counters of a method family, creating them on first
// use. Families are bounded by the configured policies plus "other".
func (s *Stats) Family(f string) *FamilyStats {
	if v, ok := s.families.Load(f); ok {
		return v.(*FamilyStats)
	}
	v, _ := s.families.LoadOrStore(f, new(FamilyStats))
	return v.(*FamilyStats)
}

// Families calls fn for every family seen so far.
func (s *Stats) Families(fn func(family string, fs *FamilyStats)) {
	s.families.Range(func(k, v any) bool {
		fn(k.(string), v.(*FamilyStats))
		return true
	})
}
