package main

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// scenario makes the traffic of one attack on one target.
type scenario struct {
	name string
	// targeter returns a fresh targeter for one attack on t (attack names
	// it uniquely, so that captchas of one attack never match another's)
	// and an observer of its results (nil when it needs none).
	targeter func(t *target, attack string) (vegeta.Targeter, func(*vegeta.Result))
	// ok reports whether a response is a correct answer (beyond HTTP 2xx).
	ok func(r *vegeta.Result) bool
	// about describes the traffic for the report.
	about string
}

func (s *scenario) describe(o options) string { return s.about }

// prepareScenario readies the scenario o asks for: for hit, a solved task
// whose answer solveonce has cached (and the static baseline serving the
// same bytes); for pass, a check that getbalance goes through.
func prepareScenario(ctx context.Context, o options, e *environment) (*scenario, error) {
	so, _ := e.target(targetSolveonce)
	switch o.scenario {
	case "hit":
		id, answer, err := solveOne(ctx, o, so)
		if err != nil {
			return nil, err
		}
		path := "/res.php?" + url.Values{"key": {o.key}, "action": {"get"}, "id": {id}}.Encode()
		// Every target must answer with the very same bytes.
		for _, t := range e.targets {
			body, err := fetch(ctx, t, http.MethodGet, path, nil, "")
			if err != nil {
				return nil, fmt.Errorf("hit: %s: %w", t.name, err)
			}
			if !bytes.Equal(body, answer) {
				return nil, fmt.Errorf("hit: %s answers %q, solveonce %q", t.name, body, answer)
			}
		}
		if o.baseline {
			if err := e.startStatic(ctx, answer, o.mode == "proxy"); err != nil {
				return nil, err
			}
		}
		return &scenario{
			name: "hit",
			targeter: func(t *target, _ string) (vegeta.Targeter, func(*vegeta.Result)) {
				return vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: t.url(path)}), nil
			},
			ok:    func(r *vegeta.Result) bool { return bytes.Equal(r.Body, answer) },
			about: fmt.Sprintf("GET res.php for one solved task (%q): a cache hit in solveonce", answer),
		}, nil

	case "pass":
		path := "/res.php?" + url.Values{"key": {o.key}, "action": {"getbalance"}}.Encode()
		body, err := fetch(ctx, so, http.MethodGet, path, nil, "")
		if err != nil {
			return nil, fmt.Errorf("pass: %w", err)
		}
		if bytes.HasPrefix(body, []byte("ERROR")) {
			return nil, fmt.Errorf("pass: getbalance answered %q", body)
		}
		return &scenario{
			name: "pass",
			targeter: func(t *target, _ string) (vegeta.Targeter, func(*vegeta.Result)) {
				return vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: t.url(path)}), nil
			},
			ok:    func(r *vegeta.Result) bool { return len(r.Body) > 0 && !bytes.HasPrefix(r.Body, []byte("ERROR")) },
			about: "GET res.php?action=getbalance: passed through to upstream by solveonce every time",
		}, nil

	default:
		return &scenario{
			name: "mix",
			targeter: func(t *target, attack string) (vegeta.Targeter, func(*vegeta.Result)) {
				m := newMix(mixConfig{
					key: o.key, attack: attack, distinct: o.distinct, dup: o.dup,
					pollers: o.pollers, interval: o.pollInterval, url: t.url,
				}, time.Now)
				return m.next, m.observe
			},
			ok: func(r *vegeta.Result) bool {
				return len(r.Body) > 0 && !bytes.HasPrefix(r.Body, []byte("ERROR"))
			},
			about: fmt.Sprintf("in.php of %d distinct captchas (repeat probability %.2f), %d poller(s) per task every %v until solved",
				o.distinct, o.dup, o.pollers, o.pollInterval),
		}, nil
	}
}

// solveOne submits a captcha through t and polls it until solved; it
// returns the task ID and the answer's bytes.
func solveOne(ctx context.Context, o options, t *target) (string, []byte, error) {
	form := submitForm(o.key, fmt.Sprintf("hit %d", time.Now().UnixNano()), 0)
	body, err := fetch(ctx, t, http.MethodPost, "/in.php", []byte(form.Encode()), "application/x-www-form-urlencoded")
	if err != nil {
		return "", nil, fmt.Errorf("hit: submit: %w", err)
	}
	id, ok := strings.CutPrefix(string(body), "OK|")
	if !ok {
		return "", nil, fmt.Errorf("hit: submit answered %q", body)
	}
	path := "/res.php?" + url.Values{"key": {o.key}, "action": {"get"}, "id": {id}}.Encode()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		body, err := fetch(ctx, t, http.MethodGet, path, nil, "")
		if err != nil {
			return "", nil, fmt.Errorf("hit: poll: %w", err)
		}
		switch {
		case bytes.HasPrefix(body, []byte("OK|")):
			return id, body, nil
		case string(body) != "CAPCHA_NOT_READY":
			return "", nil, fmt.Errorf("hit: poll answered %q", body)
		}
		select {
		case <-ctx.Done():
			return "", nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return "", nil, fmt.Errorf("hit: task %s not solved within 30s", id)
}

// fetch makes one request to t and returns the body of a 200 answer.
func fetch(ctx context.Context, t *target, method, path string, body []byte, contentType string) ([]byte, error) {
	c := t.client(10*time.Second, 1)
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, t.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s %s: %s: %q", method, path, resp.Status, b)
	}
	return b, nil
}

// submitForm is an in.php image submission (method=base64) of captcha n
// of an attack.
func submitForm(key, attack string, n int) url.Values {
	img := fmt.Sprintf("\x89PNG\r\n\x1a\n loadtest %s captcha %d %s", attack, n, strings.Repeat("x", 64))
	return url.Values{"key": {key}, "method": {"base64"}, "body": {base64.StdEncoding.EncodeToString([]byte(img))}}
}

// mixConfig shapes the realistic traffic.
type mixConfig struct {
	key      string
	attack   string
	distinct int
	dup      float64
	pollers  int
	interval time.Duration
	url      func(path string) string
}

// mix is the realistic scenario's targeter: each hit is a due poll if
// there is one, else a submission — of a captcha already submitted with
// probability dup (or when all distinct ones are used), else of the next
// new one. Every task ID a submission gets back starts pollers pollers,
// each polling every interval until the answer is not CAPCHA_NOT_READY.
type mix struct {
	cfg  mixConfig
	now  func() time.Time
	form map[int][]byte // body of captcha n, built once

	mu   sync.Mutex // guards the fields below
	rnd  *rand.Rand
	used int       // captchas submitted so far: 0..used-1
	due  pollQueue // polls by due time
}

func newMix(cfg mixConfig, now func() time.Time) *mix {
	return &mix{cfg: cfg, now: now, form: map[int][]byte{}, rnd: rand.New(rand.NewPCG(uint64(now().UnixNano()), 1))}
}

// next is the vegeta.Targeter; vegeta calls it from many goroutines.
func (m *mix) next(t *vegeta.Target) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.due) > 0 && !m.due[0].at.After(m.now()) {
		p := heap.Pop(&m.due).(*poll)
		*t = vegeta.Target{
			Method: http.MethodGet,
			URL:    m.cfg.url("/res.php?" + url.Values{"key": {m.cfg.key}, "action": {"get"}, "id": {p.id}}.Encode()),
		}
		return nil
	}
	n := m.used
	if m.used > 0 && (m.used >= m.cfg.distinct || m.rnd.Float64() < m.cfg.dup) {
		n = m.rnd.IntN(m.used)
	} else {
		m.used++
	}
	body, ok := m.form[n]
	if !ok {
		body = []byte(submitForm(m.cfg.key, m.cfg.attack, n).Encode())
		m.form[n] = body
	}
	*t = vegeta.Target{
		Method: http.MethodPost,
		URL:    m.cfg.url("/in.php"),
		Body:   body,
		Header: http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
	}
	return nil
}

// observe schedules the polls a result calls for.
func (m *mix) observe(r *vegeta.Result) {
	if r.Code != http.StatusOK {
		return
	}
	switch {
	case r.Method == http.MethodPost && bytes.HasPrefix(r.Body, []byte("OK|")):
		id := string(r.Body[3:])
		m.mu.Lock()
		at := m.now().Add(m.cfg.interval)
		for range m.cfg.pollers {
			heap.Push(&m.due, &poll{at: at, id: id})
		}
		m.mu.Unlock()
	case r.Method == http.MethodGet && string(r.Body) == "CAPCHA_NOT_READY":
		q, err := url.Parse(r.URL)
		if err != nil {
			return
		}
		m.mu.Lock()
		heap.Push(&m.due, &poll{at: m.now().Add(m.cfg.interval), id: q.Query().Get("id")})
		m.mu.Unlock()
	}
}

// poll is one poll of a task, due at at.
type poll struct {
	at time.Time
	id string
}

// pollQueue is a min-heap of polls by due time.
type pollQueue []*poll

func (q pollQueue) Len() int           { return len(q) }
func (q pollQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q pollQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *pollQueue) Push(x any)        { *q = append(*q, x.(*poll)) }
func (q *pollQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	*q = old[:len(old)-1]
	return p
}
