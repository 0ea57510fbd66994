package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// checkLoopbackURL accepts only http URLs whose host is a loopback IP
// address (or "localhost").
func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%q: only http:// on loopback is supported", raw)
	}
	if !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("%q: not a loopback address; the load test talks to 127.0.0.1 only", raw)
	}
	return nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// loopbackDial dials addr only if it is a loopback IP address: a
// misconfigured target (or a proxy-mode URL used without its proxy) can
// never make the load test reach another machine.
func loopbackDial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("loadtest: dial %s: %w", addr, err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("loadtest: refusing to dial %s: loopback only", addr)
		}
		return d.DialContext(ctx, network, addr)
	}
}

// newTransport is a client transport that dials loopback only, through
// proxy when it is not nil, keeping up to conns idle connections.
func newTransport(proxy *url.URL, conns int) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         loopbackDial(d),
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	return tr
}
