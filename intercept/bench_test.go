package intercept_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/url"
	"testing"

	"github.com/solveonce/solveonce/breaker"
	"github.com/solveonce/solveonce/cache"
	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/captchaaitest"
	"github.com/solveonce/solveonce/intercept"
	"github.com/solveonce/solveonce/store"
	"github.com/solveonce/solveonce/upstream"
)

const benchKey = "0123456789abcdef0123456789abcdef"

// newLayer builds the real core in front of a fake CaptchaAI.
func newLayer(tb testing.TB, opts ...captchaaitest.Option) (*intercept.Layer, *captchaaitest.Server) {
	tb.Helper()
	fake := captchaaitest.NewServer(tb, opts...)
	l, closeLayer, err := buildLayer(fake.URL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(closeLayer)
	return l, fake
}

// buildLayer wires upstream client, answer cache and memory index as main does.
func buildLayer(baseURL string) (*intercept.Layer, func(), error) {
	up, err := upstream.New(upstream.Config{BaseURL: baseURL}, breaker.New("test", breaker.Config{}, upstream.IsFailure), nil)
	if err != nil {
		return nil, nil, err
	}
	answers, err := cache.New(cache.Config{})
	if err != nil {
		return nil, nil, err
	}
	return intercept.New(intercept.Config{}, up, answers, store.NewMemory(store.MemoryConfig{})), answers.Close, nil
}

func submitReq(img []byte) *captchaai.Request {
	q := url.Values{"key": {benchKey}, "method": {"base64"}, "body": {base64.StdEncoding.EncodeToString(img)}}
	return captchaai.Parse(http.MethodPost, "/in.php", "", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, []byte(q.Encode()))
}

// BenchmarkSubmitReplayed measures a repeated submission answered from the
// index (parse excluded: the request is parsed once).
func BenchmarkSubmitReplayed(b *testing.B) {
	l, fake := newLayer(b)
	img := make([]byte, 8<<10)
	r := submitReq(img)
	ctx := context.Background()
	if _, err := l.Submit(ctx, r); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s, err := l.Submit(ctx, r)
		if err != nil || s.Outcome != intercept.Replayed {
			b.Fatalf("%v %v", s, err)
		}
	}
	b.StopTimer()
	if fake.Submits() != 1 {
		b.Fatalf("upstream submits = %d", fake.Submits())
	}
}

// BenchmarkResultHit measures a res.php poll answered from the cache,
// including parsing the query as the proxy does.
func BenchmarkResultHit(b *testing.B) {
	l, fake := newLayer(b, captchaaitest.SolveAfterPolls(0))
	ctx := context.Background()
	s, err := l.Submit(ctx, submitReq([]byte("img")))
	if err != nil {
		b.Fatal(err)
	}
	query := "key=" + benchKey + "&action=get&id=" + s.Task()
	if a, _, err := l.Result(ctx, captchaai.Parse(http.MethodGet, "/res.php", query, http.Header{}, nil)); err != nil || a.Status != captchaai.StatusOK {
		b.Fatalf("%v %v", a, err)
	}
	polls := fake.Polls()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r := captchaai.Parse(http.MethodGet, "/res.php", query, http.Header{}, nil)
		a, out, err := l.Result(ctx, r)
		if err != nil || out != intercept.Hit || len(a.Render(r.Format)) == 0 {
			b.Fatal(out, err)
		}
	}
	b.StopTimer()
	if fake.Polls() != polls {
		b.Fatal("a cache hit reached upstream")
	}
}
