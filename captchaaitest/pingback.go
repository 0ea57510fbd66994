package captchaaitest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// loopbackURL reports whether raw is an http(s) URL whose host is a
// loopback address or localhost: the only pingback targets the fake
// delivers to.
func loopbackURL(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, false
	}
	h := u.Hostname()
	if strings.EqualFold(h, "localhost") {
		return u, true
	}
	ip := net.ParseIP(h)
	return u, ip != nil && ip.IsLoopback()
}

// pingbackLocked starts the one delivery of t's pingback, if it has one.
// s.mu must be held.
func (s *Server) pingbackLocked(t *task) {
	if t.Pingback == "" || t.pinged || s.closed {
		return
	}
	t.pinged = true
	u, ok := loopbackURL(t.Pingback)
	if !ok {
		return // refused silently: the fake only calls loopback receivers
	}
	code := t.Answer
	if t.Code != "" {
		code = t.Code
	}
	q := "id=" + url.QueryEscape(t.ID) + "&code=" + url.QueryEscape(code)
	if u.RawQuery != "" {
		u.RawQuery += "&" + q
	} else {
		u.RawQuery = q
	}
	target := u.String()
	s.wg.Add(1) // s.closed is false under s.mu, so Close has not started waiting
	s.pingbacks.Add(1)
	go func() {
		defer s.wg.Done()
		s.deliver(target)
	}()
}

// deliver performs one pingback GET, bounded by PingbackTimeout and
// cancelled by Close. Failures are dropped, as upstream drops them.
func (s *Server) deliver(target string) {
	ctx, cancel := context.WithTimeout(s.ctx, PingbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, http.NoBody)
	if err != nil {
		return
	}
	resp, err := s.pbClient.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// schedulePingbackLocked arranges for a time-based task's pingback to be
// sent when it becomes ready, even if nobody polls. s.mu must be held.
func (s *Server) schedulePingbackLocked(t *task, after time.Duration) {
	if t.Pingback == "" || s.closed {
		return
	}
	id := t.ID
	s.timers[id] = time.AfterFunc(after, func() {
		if !s.enter() {
			return
		}
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.timers, id)
		if t := s.tasks[id]; t != nil {
			s.readyLocked(t, time.Now())
		}
	})
}
