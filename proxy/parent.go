package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"golang.org/x/net/http/httpproxy"
)

// parentFunc picks the parent proxy for a destination URL; a nil URL means
// a direct connection.
type parentFunc func(dst *url.URL) (*url.URL, error)

// ParentEnv is the parent_proxy value that takes the parent from the
// process's HTTP_PROXY, HTTPS_PROXY and NO_PROXY.
const ParentEnv = "env"

// parseParent interprets Config.ParentProxy: "" → nil (direct), "env" →
// the process environment, or a fixed http, https, socks5 or socks5h URL.
func parseParent(raw string) (parentFunc, error) {
	switch raw {
	case "":
		return nil, nil
	case ParentEnv:
		pf := httpproxy.FromEnvironment().ProxyFunc()
		return func(dst *url.URL) (*url.URL, error) {
			u, err := pf(dst)
			if err != nil {
				return nil, fmt.Errorf("parent proxy from the environment: %w", err)
			}
			if u != nil {
				if err := checkParentURL(u); err != nil {
					return nil, fmt.Errorf("parent proxy from the environment: %w", err)
				}
			}
			return u, nil
		}, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL", redactURL(raw))
	}
	if err := checkParentURL(u); err != nil {
		return nil, err
	}
	return func(*url.URL) (*url.URL, error) { return u, nil }, nil
}

func checkParentURL(u *url.URL) error {
	switch u.Scheme {
	case "http", "https", "socks5", "socks5h":
	default:
		return fmt.Errorf("%q: scheme must be http, https, socks5 or socks5h", u.Redacted())
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q has no host", u.Redacted())
	}
	return nil
}

// ParentProxyFunc returns the Proxy function for solveonce's own upstream
// transport when cfg.ParentProxyUpstream asks for CaptchaAI traffic to go
// through cfg.ParentProxy, and nil (direct, never from the environment)
// otherwise. Give it to upstream.NewTransport's result:
//
//	tr := upstream.NewTransport(cfg.Upstream.MaxInFlight)
//	tr.Proxy = pf
func ParentProxyFunc(cfg Config) (func(*http.Request) (*url.URL, error), error) {
	if !cfg.ParentProxyUpstream || cfg.ParentProxy == "" {
		return nil, nil
	}
	pf, err := parseParent(cfg.ParentProxy)
	if err != nil {
		return nil, fmt.Errorf("proxy.parent_proxy: %w", err)
	}
	return func(r *http.Request) (*url.URL, error) { return pf(r.URL) }, nil
}

// parentAddr is the parent's host:port, with the scheme's default port.
func parentAddr(u *url.URL) string {
	if p := u.Port(); p != "" {
		return net.JoinHostPort(u.Hostname(), p)
	}
	port := map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[u.Scheme]
	return net.JoinHostPort(u.Hostname(), port)
}

// connectVia opens a tunnel to target through the parent u over conn, an
// established connection to the parent.
func connectVia(ctx context.Context, conn net.Conn, u *url.URL, target string, tlsConf *tls.Config) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var err error
	switch u.Scheme {
	case "https":
		cfg := tlsConf.Clone()
		cfg.ServerName = u.Hostname()
		tc := tls.Client(conn, cfg)
		if err = tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("TLS to parent proxy %s: %w", u.Host, err)
		}
		conn, err = httpConnect(tc, u, target)
	case "http":
		conn, err = httpConnect(conn, u, target)
	default: // socks5, socks5h
		err = socks5Connect(conn, u, target)
	}
	if err != nil {
		return nil, err
	}
	if !stop() {
		return nil, ctx.Err()
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, nil
}

// httpConnect asks an HTTP proxy for a tunnel with CONNECT.
func httpConnect(conn net.Conn, u *url.URL, target string) (net.Conn, error) {
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: http.Header{},
	}
	if u.User != nil {
		pw, _ := u.User.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pw))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("CONNECT via parent proxy %s: %w", u.Host, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("CONNECT via parent proxy %s: %w", u.Host, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("CONNECT via parent proxy %s: %s", u.Host, resp.Status)
	}
	if br.Buffered() > 0 { // the target spoke first; keep its bytes
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// bufferedConn reads what a bufio.Reader still holds before the
// connection itself.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errNoHalfClose
}

// SOCKS5 (RFC 1928, username/password RFC 1929) constants.
const (
	socksVersion   = 5
	socksNoAuth    = 0
	socksUserPass  = 2
	socksNoMethods = 0xff
	socksConnect   = 1
	socksIPv4      = 1
	socksDomain    = 3
	socksIPv6      = 4
)

// socks5Connect asks a SOCKS5 proxy for a TCP connection to target. Host
// names are sent to the proxy to resolve (as socks5h does): scrapers use a
// proxy pool precisely so that the target sees, and resolves from, the
// pool's network.
func socks5Connect(conn net.Conn, u *url.URL, target string) error {
	if err := socks5Handshake(conn, u, target); err != nil {
		return fmt.Errorf("SOCKS5 via parent proxy %s: %w", u.Host, err)
	}
	return nil
}

func socks5Handshake(conn net.Conn, u *url.URL, target string) error {
	host, portStr, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("bad target %q: %w", target, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return fmt.Errorf("bad port %q: %w", portStr, err)
	}
	methods := []byte{socksNoAuth}
	if u.User != nil {
		methods = []byte{socksNoAuth, socksUserPass}
	}
	if _, err := conn.Write(append([]byte{socksVersion, byte(len(methods))}, methods...)); err != nil {
		return err
	}
	var buf [4]byte
	if _, err := io.ReadFull(conn, buf[:2]); err != nil {
		return err
	}
	if buf[0] != socksVersion {
		return errors.New("not a SOCKS5 server")
	}
	switch buf[1] {
	case socksNoAuth:
	case socksUserPass:
		if err := socks5Auth(conn, u.User); err != nil {
			return err
		}
	case socksNoMethods:
		return errors.New("no acceptable authentication method")
	default:
		return fmt.Errorf("unexpected method %d", buf[1])
	}

	req := []byte{socksVersion, socksConnect, 0}
	if ip := net.ParseIP(host); ip != nil {
		if ip4 := ip.To4(); ip4 != nil {
			req = append(append(req, socksIPv4), ip4...)
		} else {
			req = append(append(req, socksIPv6), ip.To16()...)
		}
	} else {
		if len(host) > 255 {
			return errors.New("host name too long")
		}
		req = append(append(req, socksDomain, byte(len(host))), host...)
	}
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	if _, err := conn.Write(req); err != nil {
		return err
	}
	if _, err := io.ReadFull(conn, buf[:4]); err != nil {
		return err
	}
	if buf[1] != 0 {
		return fmt.Errorf("connect to %s refused (reply %d)", target, buf[1])
	}
	var skip int64
	switch buf[3] {
	case socksIPv4:
		skip = 4 + 2
	case socksIPv6:
		skip = 16 + 2
	case socksDomain:
		if _, err := io.ReadFull(conn, buf[:1]); err != nil {
			return err
		}
		skip = int64(buf[0]) + 2
	default:
		return fmt.Errorf("bad address type %d", buf[3])
	}
	_, err = io.CopyN(io.Discard, conn, skip)
	return err
}

// socks5Auth is the username/password subnegotiation (RFC 1929).
func socks5Auth(conn net.Conn, user *url.Userinfo) error {
	if user == nil {
		return errors.New("credentials required")
	}
	name := user.Username()
	pw, _ := user.Password()
	if len(name) > 255 || len(pw) > 255 {
		return errors.New("credentials too long")
	}
	msg := append([]byte{1, byte(len(name))}, name...)
	msg = append(append(msg, byte(len(pw))), pw...)
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	var buf [2]byte
	if _, err := io.ReadFull(conn, buf[:]); err != nil {
		return err
	}
	if buf[1] != 0 {
		return errors.New("authentication failed")
	}
	return nil
}

// errParentLoop is returned when the parent proxy is solveonce itself.
var errParentLoop = errors.New("points at solveonce's own listen address: traffic would loop (a sidecar inheriting HTTPS_PROXY?)")
