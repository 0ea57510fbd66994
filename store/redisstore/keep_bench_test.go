package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
)

// BenchmarkRedisUpdateKeep measures an Update whose function keeps the
// value: what every replayed submission costs on the index.
func BenchmarkRedisUpdateKeep(b *testing.B) {
	srv := redistest.Start(b)
	idx := newIndex(b, srv.Client(b), uniquePrefix())
	ctx := context.Background()
	if _, _, err := idx.Update(ctx, "k", putFn("0123456789abcdef0123456789abcdef", time.Hour)); err != nil {
		b.Fatal(err)
	}
	keep := func(cur []byte, ok bool) ([]byte, time.Duration, store.Op) { return nil, 0, store.Keep }
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := idx.Update(ctx, "k", keep); err != nil || !ok {
			b.Fatalf("Update: %v, %v", ok, err)
		}
	}
}
