package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Timeouts for traffic to other hosts. There is no overall request
// timeout: the client has its own, and its leaving cancels the request.
const (
	dialTimeout         = 10 * time.Second
	tlsHandshakeTimeout = 10 * time.Second
	idleConnTimeout     = 90 * time.Second
	tcpKeepAlive        = 30 * time.Second
)

// dialer connects to other hosts, directly or through the parent proxy,
// and never to an intercepted host.
type dialer struct {
	parent    parentFunc // nil: direct
	hosts     hostSet
	net       net.Dialer
	parentTLS *tls.Config // TLS to an https parent; tests swap the roots
}

func newDialer(parent parentFunc, hosts hostSet) *dialer {
	return &dialer{
		parent:    parent,
		hosts:     hosts,
		net:       net.Dialer{Timeout: dialTimeout, KeepAlive: tcpKeepAlive},
		parentTLS: &tls.Config{MinVersion: tls.VersionTLS12},
	}
}

// dialDirect is a plain TCP dial that refuses intercepted hosts: solveonce
// never connects to (nor resolves) them; its upstream is configured.
func (d *dialer) dialDirect(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.hosts.match(addr) {
		return nil, fmt.Errorf("proxy: refusing to connect to intercepted host %s", addr)
	}
	c, err := d.net.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("proxy: dial %s: %w", addr, err)
	}
	return c, nil
}

// dialTunnel connects to target (host:port) for a CONNECT tunnel, through
// the parent proxy when there is one for it.
func (d *dialer) dialTunnel(ctx context.Context, target string) (net.Conn, error) {
	var pu *url.URL
	if d.parent != nil {
		var err error
		if pu, err = d.parent(&url.URL{Scheme: "https", Host: target}); err != nil {
			return nil, err
		}
	}
	if pu == nil {
		return d.dialDirect(ctx, "tcp", target)
	}
	conn, err := d.dialDirect(ctx, "tcp", parentAddr(pu))
	if err != nil {
		return nil, err
	}
	tc, err := connectVia(ctx, conn, pu, target, d.parentTLS)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return tc, nil
}

// transport is the round tripper for plain-http requests to other hosts:
// TLS verified (for the rare absolute-form https:// request), the parent
// proxy or none (never the environment), keep-alive, bodies untouched
// (no transparent gzip).
func (d *dialer) transport() *http.Transport {
	tr := &http.Transport{
		DialContext:           d.dialDirect,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   tlsHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       idleConnTimeout,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   16,
		DisableCompression:    true,
	}
	if d.parent != nil {
		pf := d.parent
		tr.Proxy = func(r *http.Request) (*url.URL, error) { return pf(r.URL) }
	}
	return tr
}

// tunnel splices a CONNECT to another host byte for byte: no TLS, no
// certificate, the client talks to the origin itself. The dial happens
// before the 200, so a failure is an ordinary 502.
func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, target string) {
	ctx, cancel := context.WithTimeout(r.Context(), dialTimeout)
	up, err := s.dial.dialTunnel(ctx, target)
	cancel()
	if err != nil {
		s.log.Debug("tunnel dial failed", "host", target, "err", err)
		http.Error(w, "solveonce: cannot reach "+target, http.StatusBadGateway)
		return
	}
	client, rw, err := s.track(w, 0).Hijack()
	if err != nil {
		_ = up.Close()
		s.log.Debug("tunnel hijack failed", "host", target, "err", err)
		http.Error(w, "solveonce: cannot tunnel over this connection", http.StatusInternalServerError)
		return
	}
	tc := client.(*trackedConn)
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		_ = tc.Close()
		_ = up.Close()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.Stats.Tunnels.Add(1)
	s.log.Debug("tunnel", "host", target)

	if _, err := io.WriteString(tc, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = tc.Close()
		_ = up.Close()
		return
	}
	// Bytes the client sent right behind the CONNECT (a TLS ClientHello in
	// the same packet) are in the server's read buffer: pass them on first.
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			_ = tc.Close()
			_ = up.Close()
			return
		}
	}
	splice(tc, up)
}

// splice copies both ways until both directions end, passing a clean end
// of stream on as a half-close, then closes both connections. It copies
// between the raw connections so that the kernel can splice TCP to TCP.
func splice(client *trackedConn, up net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, client.Conn, client) })
	pipe(client, up, up)
	wg.Wait()
	_ = client.Close()
	_ = up.Close()
}

// pipe copies src to dst. At src's end of stream it half-closes dst, so
// the other side sees it; on an error, or when dst cannot be half-closed,
// it closes both, which also ends the copy in the other direction.
func pipe(dst net.Conn, src io.Reader, srcConn net.Conn) {
	w := io.Writer(dst)
	if tc, ok := dst.(*trackedConn); ok {
		w = tc.Conn
	}
	_, err := io.Copy(w, src)
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	_ = dst.Close()
	_ = srcConn.Close()
}

// hopByHop are the fields RFC 9110 §7.6.1 says a proxy must not forward,
// besides those the Connection field names, plus the proxy's own
// authentication fields (§11.7), which belong to this hop only.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade",
	"Proxy-Authorization", "Proxy-Authenticate",
}

// removeHopByHop deletes hop-by-hop fields from h. When keepUpgrade (a
// protocol upgrade such as WebSocket is being relayed) the upgrade is
// re-announced to the next hop, as it must be; "TE: trailers" is kept.
func removeHopByHop(h http.Header, keepUpgrade bool) {
	upgrade := h.Values("Upgrade")
	trailers := headerHasToken(h, "Te", "trailers")
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(textproto.CanonicalMIMEHeaderKey(f))
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	if trailers {
		h.Set("Te", "trailers")
	}
	if keepUpgrade && len(upgrade) > 0 {
		h["Upgrade"] = upgrade
		h.Set("Connection", "Upgrade")
	}
}

// isUpgrade reports whether h asks for a protocol upgrade.
func isUpgrade(h http.Header) bool {
	return h.Get("Upgrade") != "" && headerHasToken(h, "Connection", "upgrade")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}
