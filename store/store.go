// Package store keeps solveonce's exact, shared state: the submission index
// that maps a CAPTCHA fingerprint to the task it produced, and the small
// records that go with it.
//
// Unlike the answer cache, a store never drops a write it acknowledged. It is a
// tiny key/value interface with an atomic read-modify-write, so the policy that
// decides what a record means lives in package intercept as a pure function and
// every implementation (Memory here, Redis in store/redisstore) only has to be
// correct, not clever.
package store

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Op is what an update function asks the store to do with a key.
type Op uint8

const (
	// Keep leaves the key as it is (no write).
	Keep Op = iota
	// Put stores the returned value with the returned TTL.
	Put
	// Delete removes the key.
	Delete
)

// UpdateFunc computes the next value of a key from its current one. cur is
// nil and ok false when the key is absent or expired. It may be called more
// than once for one Update (optimistic retries) and must therefore be pure:
// no I/O, no side effects outside its return values. ttl must be positive
// when op is Put.
type UpdateFunc func(cur []byte, ok bool) (next []byte, ttl time.Duration, op Op)

// Index is the exact store behind deduplication. Implementations are safe
// for concurrent use by many goroutines and, for shared implementations, by
// many processes.
type Index interface {
	// Get returns the value stored under key.
	Get(ctx context.Context, key string) (val []byte, ok bool, err error)
	// Update atomically applies fn to key and returns the value stored
	// afterwards (ok false when the key is absent afterwards).
	Update(ctx context.Context, key string, fn UpdateFunc) (val []byte, ok bool, err error)
	// Delete removes key; deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// Subscribe returns a channel that receives a value (best effort, never
	// blocking the writer) after key is changed by Update or Delete, by
	// this process or any other sharing the store. Subscribe before reading
	// the key to avoid missing a change. A wakeup may be spurious (the key
	// unchanged, e.g. after a shared store's connection recovered): the
	// subscriber re-reads the key and decides. cancel releases the
	// subscription; it is safe to call more than once.
	Subscribe(ctx context.Context, key string) (changed <-chan struct{}, cancel func(), err error)
	// Ping reports whether the store is reachable.
	Ping(ctx context.Context) error
}

// ErrConflict is returned by Update when a shared store saw concurrent
// writers more often than its retry bound, or its context's deadline,
// allowed. Nothing was written; the caller may retry. It means the store
// answered: a wrapper that fails over on errors does not count it as an
// outage.
var ErrConflict = errors.New("store: too many concurrent updates")

// ErrInvalidUpdate is returned (wrapped) by Update when fn asked for something
// no store can do: Put with a non-positive ttl, or an Op that is not Keep, Put
// or Delete. Nothing is written.
var ErrInvalidUpdate = errors.New("store: invalid update")

// String returns the name of the op ("keep", "put", "delete"), or "op(N)" for
// an unknown value.
func (o Op) String() string {
	switch o {
	case Keep:
		return "keep"
	case Put:
		return "put"
	case Delete:
		return "delete"
	default:
		return "op(" + strconv.Itoa(int(o)) + ")"
	}
}
