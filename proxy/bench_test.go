package proxy

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/solveonce/solveonce/captchaaitest"
)

// BenchmarkLeafCert signs a leaf for a new host every iteration (key
// generation, signature, parse, cache insert).
func BenchmarkLeafCert(b *testing.B) {
	ca, _, err := NewCA()
	if err != nil {
		b.Fatal(err)
	}
	m := newMITM(ca, nil)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := m.leaf("h" + strconv.Itoa(i) + ".example.com"); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkLeafCertCached is the steady state: every handshake after the
// first for a host.
func BenchmarkLeafCertCached(b *testing.B) {
	ca, _, err := NewCA()
	if err != nil {
		b.Fatal(err)
	}
	m := newMITM(ca, nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.leaf("ocr.captchaai.com"); err != nil {
			b.Fatal(err)
		}
	}
}

// benchResultHit measures a res.php cache hit over one reused connection.
func benchResultHit(b *testing.B, mitm bool) {
	s := newStack(b, stackOptions{fake: []captchaaitest.Option{captchaaitest.SolveAfterPolls(1)}})
	var c *http.Client
	base := s.URL
	if mitm {
		c = s.client(b, nil, nil)
		base = "https://ocr.captchaai.com"
	} else {
		c = directClient(b)
	}
	c.Transport.(*http.Transport).MaxConnsPerHost = 1
	id := taskID(b, postForm(b, c, base+"/in.php", imageForm(keyA, 1, false)))
	u := base + "/res.php?" + url.Values{"key": {keyA}, "action": {"get"}, "id": {id}}.Encode()
	if r := get(b, c, u); r.Outcome != "miss" {
		b.Fatalf("first poll: %s %q", r.Outcome, r.Body)
	}
	if r := get(b, c, u); r.Outcome != "hit" {
		b.Fatalf("second poll: %s %q", r.Outcome, r.Body)
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
	if err != nil {
		b.Fatal(err)
	}
	polls := s.Fake.Polls()
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	b.StopTimer()
	if got := s.Fake.Polls(); got != polls {
		b.Fatalf("%d upstream polls during the benchmark, want 0", got-polls)
	}
}

// BenchmarkResultHitMITM: a res.php hit through the proxy, inside a MITM'd
// TLS tunnel kept alive across requests.
func BenchmarkResultHitMITM(b *testing.B) { benchResultHit(b, true) }

// BenchmarkResultHitBaseURL: the same hit in base-URL mode, for comparison.
func BenchmarkResultHitBaseURL(b *testing.B) { benchResultHit(b, false) }
