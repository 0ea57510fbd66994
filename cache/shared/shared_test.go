package shared_test

import (
	"context"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/cache/shared"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/store/redisstore/redistest"
)

var prefixes atomic.Int64

func uniquePrefix() string { return "test" + strconv.FormatInt(prefixes.Add(1), 10) + ":" }

// quick bounds commands by their context, as solveonce configures clients.
func quick(o *redis.Options) {
	o.ContextTimeoutEnabled = true
	o.DialTimeout = 250 * time.Millisecond
}

func mustParse(t *testing.T, body string) captchaai.Answer {
	t.Helper()
	a, err := captchaai.ParseAnswer([]byte(body))
	if err != nil {
		t.Fatalf("ParseAnswer(%q): %v", body, err)
	}
	return a
}

func newL1(t *testing.T, cfg cache.Config) *cache.Answers {
	t.Helper()
	c, err := cache.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Every kind of answer survives Redis byte for byte, with its TTL.
func TestAnswersRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	l2 := shared.New(srv.Client(t, quick), shared.Config{Prefix: uniquePrefix()})
	ctx := t.Context()
	textOK := mustParse(t, "OK|ANS12345|with|pipes")
	textOK.ContentType = "text/plain; charset=utf-8"
	jsonOK := mustParse(t, `{"status":1,"request":12345678901}`)
	jsonOK.ContentType = "application/json"
	jsonOK.HTTPStatus = 200
	cases := map[string]captchaai.Answer{
		"text ok":      textOK,
		"json ok":      jsonOK,
		"json token":   mustParse(t, `{"status":1,"request":"03AGdBq2\u00e9\"x"}`),
		"json spaced":  mustParse(t, `{ "status" : 1, "request" : "a<b&c>" , "extra": [1, 2] }`),
		"not ready":    mustParse(t, "CAPCHA_NOT_READY"),
		"json error":   mustParse(t, `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE","error_text":"x"}`),
		"balance":      mustParse(t, "10.50"),
		"empty body":   mustParse(t, ""),
		"synthesised":  captchaai.Text(captchaai.CodeUnsolvable),
		"binary bytes": {Status: captchaai.StatusOK, Value: "v", Raw: []byte{0, 0xff, '\r', '\n'}},
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			if !l2.Put(ctx, name, want, time.Minute) {
				t.Fatal("Put refused")
			}
			got, ttl, ok := l2.Get(ctx, name)
			if !ok {
				t.Fatal("Get missed")
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, want)
			}
			if ttl <= 59*time.Second || ttl > time.Minute {
				t.Fatalf("ttl = %v; want about 1m", ttl)
			}
		})
	}
	if _, _, ok := l2.Get(ctx, "absent"); ok {
		t.Fatal("Get(absent) hit")
	}
	// Garbage under an answer key is a miss, not a crash.
	if err := srv.Client(t).Set(ctx, l2.RedisKey("garbage"), "{not json", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := l2.Get(ctx, "garbage"); ok {
		t.Fatal("Get(garbage) hit")
	}
	if l2.Stats.Errors.Load() != 0 {
		t.Fatalf("%d errors against a healthy Redis", l2.Stats.Errors.Load())
	}
}

// A CAPCHA_NOT_READY never replaces an answer: a slow replica's stale poll
// cannot hide a solution.
func TestNotReadyNeverHidesAnAnswer(t *testing.T) {
	srv := redistest.Start(t)
	l2 := shared.New(srv.Client(t, quick), shared.Config{Prefix: uniquePrefix()})
	ctx := t.Context()
	solved := mustParse(t, "OK|ANSWER")
	pending := mustParse(t, "CAPCHA_NOT_READY")

	if !l2.Put(ctx, "k", pending, time.Minute) {
		t.Fatal("first NOT_READY refused")
	}
	if !l2.Put(ctx, "k", solved, time.Minute) {
		t.Fatal("answer refused over NOT_READY")
	}
	if l2.Put(ctx, "k", pending, time.Minute) {
		t.Fatal("NOT_READY accepted over an answer")
	}
	if got, _, _ := l2.Get(ctx, "k"); got.Value != "ANSWER" {
		t.Fatalf("Get = %q; want the answer", got.Value)
	}
}

// Two replicas' tiers over one Redis: what one puts, the other gets, and
// keeps in memory; TTL 0 picks the memory level's defaults.
func TestTieredSharesAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	prefix := uniquePrefix()
	cfg := cache.Config{PendingTTL: 3 * time.Second, DoneTTL: time.Hour}
	a := shared.NewTiered(newL1(t, cfg), shared.New(srv.Client(t, quick), shared.Config{Prefix: prefix}))
	l2b := shared.New(srv.Client(t, quick), shared.Config{Prefix: prefix, RetryMin: time.Hour})
	b := shared.NewTiered(newL1(t, cfg), l2b)
	rdb := srv.Client(t)
	ctx := t.Context()

	if !a.Put("pending", mustParse(t, "CAPCHA_NOT_READY"), 0) {
		t.Fatal("Put(NOT_READY) refused")
	}
	if ttl := rdb.PTTL(ctx, prefix+"a:pending").Val(); ttl <= 0 || ttl > 3*time.Second {
		t.Fatalf("NOT_READY PTTL = %v; want the 3s pending TTL", ttl)
	}
	if !a.Put("done", mustParse(t, "OK|SOLVED"), 0) {
		t.Fatal("Put(answer) refused")
	}
	if ttl := rdb.PTTL(ctx, prefix+"a:done").Val(); ttl <= 59*time.Minute {
		t.Fatalf("answer PTTL = %v; want the 1h done TTL", ttl)
	}
	if !a.Put("token", mustParse(t, "OK|TOKEN"), 80*time.Second) {
		t.Fatal("Put(token) refused")
	}
	if ttl := rdb.PTTL(ctx, prefix+"a:token").Val(); ttl <= 79*time.Second || ttl > 80*time.Second {
		t.Fatalf("token PTTL = %v; want the caller's 80s", ttl)
	}
	if a.Put("transient", captchaai.Text("ERROR_NO_SLOT_AVAILABLE"), 0) {
		t.Fatal("a transient error was cached")
	}

	for key, want := range map[string]string{"pending": captchaai.NotReady, "done": "SOLVED", "token": "TOKEN"} {
		got, ok := b.Get(key)
		if !ok || got.Value != want {
			t.Fatalf("replica B Get(%s) = %q, %v; want %q", key, got.Value, ok, want)
		}
	}
	if got := l2b.Stats.Hits.Load(); got != 3 {
		t.Fatalf("B's Redis hits = %d; want 3", got)
	}
	// B keeps them in memory: served with Redis gone.
	srv.Stop()
	for _, key := range []string{"done", "token"} {
		if _, ok := b.Get(key); !ok {
			t.Fatalf("replica B lost %s from memory", key)
		}
	}
	if got := l2b.Stats.Hits.Load(); got != 3 {
		t.Fatalf("B asked Redis again for answers in memory")
	}
}

// With Redis down, the tier answers from memory within one timeout, then
// skips Redis entirely until the backoff has passed, and resumes after
// Restart.
func TestTieredFailsOpen(t *testing.T) {
	srv := redistest.Start(t)
	l2 := shared.New(srv.Client(t, quick), shared.Config{Prefix: uniquePrefix(), RetryMin: 50 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	tier := shared.NewTiered(newL1(t, cache.Config{}), l2)
	srv.Stop()

	start := time.Now()
	if !tier.Put("k", mustParse(t, "OK|A"), 0) {
		t.Fatal("Put failed with Redis down; memory should take it")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Put with Redis down took %v", d)
	}
	if l2.Healthy() || l2.Stats.Errors.Load() == 0 {
		t.Fatal("failure not recorded")
	}
	start = time.Now()
	for range 1000 {
		if _, ok := tier.Get("k"); !ok {
			t.Fatal("memory hit lost")
		}
		if _, ok := tier.Get("absent"); ok {
			t.Fatal("absent key hit")
		}
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("2000 Gets with Redis down took %v", d)
	}
	if l2.Stats.Skipped.Load() == 0 {
		t.Fatal("Redis was not skipped during the backoff")
	}

	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for !l2.Put(context.Background(), "after", mustParse(t, "OK|B"), time.Minute) {
		if time.Now().After(deadline) {
			t.Fatal("Redis level never came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !l2.Healthy() {
		t.Fatal("not healthy after a successful Put")
	}
}
