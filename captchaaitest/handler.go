package captchaaitest

import (
	"net"
	"net/http"
	"strconv"
)

// handler serves the protocol over real HTTP.
type handler struct{ s *Server }

// ServeHTTP answers one request, or resets its connection for network-level
// faults.
func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	if !s.enter() {
		resetConn(w)
		return
	}
	defer s.wg.Done()
	rep := s.serve(r)
	if rep.kind != replyWrite {
		resetConn(w)
		return
	}
	hdr := w.Header()
	for k, vs := range rep.header {
		hdr[k] = vs
	}
	hdr.Set("Content-Length", strconv.Itoa(len(rep.body)))
	w.WriteHeader(rep.status)
	_, _ = w.Write(rep.body) // the client may be gone; nothing to do about it
}

// resetConn closes the request's connection with a TCP reset (SO_LINGER 0)
// without answering. Without a hijackable connection it aborts the handler,
// which makes net/http drop the connection.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // best effort: a plain close is still a failure
	}
	_ = conn.Close()
}
