package pingback

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// Result is what a replay did with one dead letter.
type Result struct {
	ID     string `json:"id"`
	Task   string `json:"task"`
	Host   string `json:"host"`
	Status string `json:"status"` // "delivered", "failed" (kept in the queue) or "skipped"
	Reason string `json:"reason,omitempty"`
}

// Replay statuses.
const (
	StatusDelivered = "delivered"
	StatusFailed    = "failed"
	StatusSkipped   = "skipped"
)

// selectEntries returns the entries named by ids (full IDs or unique
// prefixes), or all of them when ids is empty.
func selectEntries(all []Entry, ids []string) ([]Entry, error) {
	if len(ids) == 0 {
		return all, nil
	}
	var out []Entry
	seen := map[string]bool{}
	for _, id := range ids {
		id = strings.ToLower(strings.TrimSpace(id))
		var match []Entry
		for _, e := range all {
			if id != "" && strings.HasPrefix(e.ID, id) {
				match = append(match, e)
			}
		}
		switch {
		case len(match) == 0:
			return nil, fmt.Errorf("pingback: no dead letter %q", id)
		case len(match) > 1:
			return nil, fmt.Errorf("pingback: %q names %d dead letters; give more of the ID", id, len(match))
		}
		if !seen[match[0].ID] {
			seen[match[0].ID] = true
			out = append(out, match[0])
		}
	}
	return out, nil
}

// replay delivers each entry once with its stored answer (no polling: no
// API key is stored), on at most workers connections at a time. A
// delivered entry leaves the queue and joins the delivered set; a failed
// one stays with its attempt counted. Entries without an answer, and those
// busy says are being served right now, are skipped.
func replay(ctx context.Context, st *Store, snd *sender, entries []Entry, ttl time.Duration, workers int, busy func([]byte) bool) []Result {
	out := make([]Result, len(entries))
	sem := make(chan struct{}, max(workers, 1))
	var wg sync.WaitGroup
	for i, e := range entries {
		out[i] = Result{ID: e.ID, Task: e.Task, Host: hostOf(e.URL)}
		k, err := hex.DecodeString(e.ID)
		switch {
		case err != nil:
			out[i].Status, out[i].Reason = StatusSkipped, "bad ID"
			continue
		case e.Code == "":
			out[i].Status, out[i].Reason = StatusSkipped, "answer never learnt (no API key is stored to poll it); the client can still poll res.php"
			continue
		case busy != nil && busy(k):
			out[i].Status, out[i].Reason = StatusSkipped, "being delivered right now"
			continue
		}
		if done, err := st.Delivered(k, time.Now()); err == nil && done {
			if _, err := st.Remove(e.ID); err != nil {
				out[i].Status, out[i].Reason = StatusFailed, err.Error()
				continue
			}
			out[i].Status, out[i].Reason = StatusSkipped, "already delivered; removed from the queue"
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out[i].Status, out[i].Reason = StatusFailed, ctx.Err().Error()
				return
			}
			defer func() { <-sem }()
			err := snd.send(ctx, e.URL, e.Task, e.Code)
			if err == nil {
				out[i].Status = StatusDelivered
				if err := st.MarkDelivered(k, time.Now().Add(ttl)); err != nil {
					out[i].Reason = "delivered, but not recorded: " + err.Error()
				}
				return
			}
			out[i].Status, out[i].Reason = StatusFailed, err.Error()
			e.Attempts++
			e.LastError = "replay: " + err.Error()
			if uerr := st.update(e); uerr != nil {
				out[i].Reason += "; " + uerr.Error()
			}
		}()
	}
	wg.Wait()
	return out
}

// Replay delivers dead letters (all, or those named by ids) from the running
// Service, once each.
func (s *Service) Replay(ctx context.Context, ids []string) ([]Result, error) {
	all, err := s.store.DeadLetters()
	if err != nil {
		return nil, err
	}
	sel, err := selectEntries(all, ids)
	if err != nil {
		return nil, err
	}
	res := replay(ctx, s.store, s.send, sel, s.cfg.DeliveredTTL, s.cfg.Workers, s.busy)
	for _, r := range res {
		if r.Status == StatusDelivered {
			s.Stats.Replayed.Add(1)
			s.Stats.Delivered.Add(1)
		}
	}
	return res, nil
}

// Drop removes dead letters (all when all is true, else those named by ids).
func drop(st *Store, ids []string, all bool) (int, error) {
	if !all && len(ids) == 0 {
		return 0, errors.New("pingback: name the dead letters to drop, or drop all")
	}
	entries, err := st.DeadLetters()
	if err != nil {
		return 0, err
	}
	if !all {
		if entries, err = selectEntries(entries, ids); err != nil {
			return 0, err
		}
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.ID
	}
	return st.Remove(keys...)
}

// controlServer answers `solveonce dlq` on a Unix socket next to the file
// while the Service holds the file's lock.
type controlServer struct {
	srv    *http.Server
	path   string
	cancel context.CancelFunc
	done   chan struct{}
}

// socketPath is the control socket of the file at path.
func socketPath(path string) string { return path + ".sock" }

// listenControl starts the control socket of s (mode 0600).
func listenControl(path string, s *Service) (*controlServer, error) {
	sock := socketPath(path)
	_ = os.Remove(sock) // a leftover: we hold the file's lock, so nobody serves it
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("pingback: control socket: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("pingback: control socket: %w", err)
	}
	base, cancel := context.WithCancel(context.Background())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /dlq", func(w http.ResponseWriter, r *http.Request) {
		entries, err := s.store.DeadLetters()
		writeJSON(w, entries, err)
	})
	mux.HandleFunc("POST /dlq/replay", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		res, err := s.Replay(r.Context(), r.PostForm["id"])
		writeJSON(w, res, err)
	})
	mux.HandleFunc("POST /dlq/drop", func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		n, err := drop(s.store, r.PostForm["id"], r.PostForm.Get("all") == "1")
		writeJSON(w, map[string]int{"dropped": n}, err)
	})
	c := &controlServer{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			BaseContext:       func(net.Listener) context.Context { return base },
		},
		path:   sock,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go func() {
		defer close(c.done)
		_ = c.srv.Serve(ln)
	}()
	return c, nil
}

// close stops the control socket, cancelling replays in progress.
func (c *controlServer) close() {
	c.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c.srv.Shutdown(ctx) != nil {
		_ = c.srv.Close()
	}
	<-c.done
	_ = os.Remove(c.path)
}

func writeJSON(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// Manager lists, replays and drops dead letters for `solveonce dlq`:
// through the file when no solveonce holds it, otherwise through the
// running solveonce's control socket.
type Manager struct {
	cfg    Config
	path   string
	st     *Store       // the file, opened here
	snd    *sender      // to replay from here
	remote *http.Client // the running solveonce
}

// Manage opens the dead-letter queue of cfg (see Config.Path).
func Manage(cfg Config, dataDir string) (*Manager, error) {
	cfg = cfg.WithDefaults()
	path, err := cfg.Path(dataDir)
	if err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, path: path}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return m, nil // nothing was ever dead-lettered here
	}
	st, err := OpenStore(path, 300*time.Millisecond)
	if errors.Is(err, ErrLocked) {
		sock := socketPath(path)
		m.remote = &http.Client{
			Timeout: 10 * time.Minute,
			Transport: &http.Transport{
				Proxy: nil,
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sock)
				},
			},
		}
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	rule, err := ParseRule(cfg.Allow)
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("pingback.allow: %w", err)
	}
	m.st, m.snd = st, newSender(cfg, rule, nil)
	return m, nil
}

// Path returns the dead-letter queue file.
func (m *Manager) Path() string { return m.path }

// Remote reports whether a running solveonce does the work.
func (m *Manager) Remote() bool { return m.remote != nil }

// Close releases the file.
func (m *Manager) Close() error {
	if m.snd != nil {
		m.snd.close()
	}
	if m.remote != nil {
		m.remote.CloseIdleConnections()
	}
	if m.st != nil {
		return m.st.Close()
	}
	return nil
}

// List returns the dead letters, oldest first.
func (m *Manager) List(ctx context.Context) ([]Entry, error) {
	switch {
	case m.remote != nil:
		var out []Entry
		err := m.call(ctx, http.MethodGet, "/dlq", nil, &out)
		return out, err
	case m.st != nil:
		return m.st.DeadLetters()
	}
	return nil, nil
}

// Replay delivers the dead letters named by ids (all when none), once each.
func (m *Manager) Replay(ctx context.Context, ids []string) ([]Result, error) {
	switch {
	case m.remote != nil:
		var out []Result
		err := m.call(ctx, http.MethodPost, "/dlq/replay", url.Values{"id": ids}, &out)
		return out, err
	case m.st != nil:
		all, err := m.st.DeadLetters()
		if err != nil {
			return nil, err
		}
		sel, err := selectEntries(all, ids)
		if err != nil {
			return nil, err
		}
		return replay(ctx, m.st, m.snd, sel, m.cfg.DeliveredTTL, m.cfg.Workers, nil), nil
	}
	if len(ids) > 0 {
		return nil, fmt.Errorf("pingback: no dead letter %q", ids[0])
	}
	return nil, nil
}

// Drop removes the dead letters named by ids, or all of them.
func (m *Manager) Drop(ctx context.Context, ids []string, all bool) (int, error) {
	switch {
	case m.remote != nil:
		v := url.Values{"id": ids}
		if all {
			v.Set("all", "1")
		}
		var out map[string]int
		err := m.call(ctx, http.MethodPost, "/dlq/drop", v, &out)
		return out["dropped"], err
	case m.st != nil:
		return drop(m.st, ids, all)
	}
	return 0, nil
}

// call asks the running solveonce.
func (m *Manager) call(ctx context.Context, method, path string, form url.Values, out any) error {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://solveonce"+path, body)
	if err != nil {
		return fmt.Errorf("pingback: control request: %w", err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := m.remote.Do(req)
	if err != nil {
		return fmt.Errorf("%w (%s), and its control socket does not answer: %w", ErrLocked, m.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("pingback: control answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return errors.New(e.Error)
		}
		return fmt.Errorf("pingback: control answer: HTTP %d", resp.StatusCode)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("pingback: control answer: %w", err)
	}
	return nil
}
