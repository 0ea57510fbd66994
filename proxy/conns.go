package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// mitmIdleTimeout closes a MITM'd connection on which the client has sent
// nothing for this long (the http.Server's IdleTimeout no longer applies
// once goproxy has taken the connection over).
const mitmIdleTimeout = 2 * time.Minute

// tunnelKey is the context key under which serveConnect hands the
// tunnelState of a MITM'd CONNECT to goproxy's hooks.
type tunnelKey struct{}

// tunnelState follows one MITM'd tunnel: its CONNECT target, the client
// connection once taken over, and whether a request on it is being
// answered (so that Shutdown closes it only between requests).
type tunnelState struct {
	host string
	busy atomic.Int32
}

// trackingWriter hands goproxy a ResponseWriter whose Hijack registers the
// connection with the Server, so that Close and Shutdown can end it.
type trackingWriter struct {
	http.ResponseWriter
	s    *Server
	st   *tunnelState // nil unless a MITM'd tunnel
	idle time.Duration
}

// track wraps w for a request goproxy may take the connection of.
func (s *Server) track(w http.ResponseWriter, idle time.Duration) *trackingWriter {
	return &trackingWriter{ResponseWriter: w, s: s, idle: idle}
}

// trackTunnel wraps w for a MITM'd CONNECT.
func (s *Server) trackTunnel(w http.ResponseWriter, st *tunnelState) *trackingWriter {
	return &trackingWriter{ResponseWriter: w, s: s, st: st, idle: mitmIdleTimeout}
}

// Hijack implements http.Hijacker.
func (w *trackingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("proxy: hijack: %w", http.ErrNotSupported)
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: hijack: %w", err)
	}
	return w.s.adopt(c, w.st, w.idle), rw, nil
}

// Flush implements http.Flusher.
func (w *trackingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// trackedConn is a connection the Server owns after a hijack. Closing it
// unregisters it.
type trackedConn struct {
	net.Conn
	s    *Server
	st   *tunnelState
	idle time.Duration // 0: no idle timeout
	once sync.Once
}

// adopt registers c; after Close it closes c at once.
func (s *Server) adopt(c net.Conn, st *tunnelState, idle time.Duration) *trackedConn {
	tc := &trackedConn{Conn: c, s: s, st: st, idle: idle}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		_ = tc.Close()
		return tc
	}
	s.conns[tc] = struct{}{}
	s.mu.Unlock()
	return tc
}

// Read extends the idle deadline before every read.
func (c *trackedConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		_ = c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	}
	return c.Conn.Read(p)
}

// Close closes and unregisters the connection; it is idempotent.
func (c *trackedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}

// CloseWrite half-closes the connection when the underlying one can.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNoHalfClose
}

// CloseRead half-closes the reading side when the underlying one can.
func (c *trackedConn) CloseRead() error {
	if cr, ok := c.Conn.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return errNoHalfClose
}

var errNoHalfClose = errors.New("proxy: connection cannot be half-closed")

// closeIdle closes every tracked connection except MITM'd ones in the
// middle of a request, and returns how many remain open.
func (s *Server) closeIdle() int {
	var idle []*trackedConn
	busy := 0
	s.mu.Lock()
	for c := range s.conns {
		if c.st != nil && c.st.busy.Load() > 0 {
			busy++
			continue
		}
		idle = append(idle, c)
	}
	s.mu.Unlock()
	for _, c := range idle {
		_ = c.Close()
	}
	return busy
}

// closeAll closes every tracked connection.
func (s *Server) closeAll() {
	s.mu.Lock()
	all := make([]*trackedConn, 0, len(s.conns))
	for c := range s.conns {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		_ = c.Close()
	}
}

// Shutdown closes the tunnels and the MITM connections that are between
// requests, waits for MITM requests in progress to be answered, and then
// closes what is left once ctx is done. It returns ctx's error if it had to
// cut requests short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopAccepting()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if s.closeIdle() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			s.closeAll()
			s.wg.Wait()
			return ctx.Err()
		case <-t.C:
		}
	}
	s.wg.Wait()
	return nil
}

// Close closes every connection taken over for a tunnel or MITM at once
// and waits for the tunnels' goroutines to end. It is idempotent.
func (s *Server) Close() error {
	s.stopAccepting()
	s.closeAll()
	s.wg.Wait()
	return nil
}

func (s *Server) stopAccepting() {
	if s.closed.CompareAndSwap(false, true) {
		s.tr.CloseIdleConnections()
	}
}
