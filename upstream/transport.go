package upstream

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"
)

// NewTransport returns the transport a Client uses when given none: TLS
// verified against the system roots, never a proxy from the environment
// (solveonce usually is the proxy), keep-alives with an idle pool large
// enough for maxInFlight concurrent requests (at least 64 per host), and
// dial failures wrapped in *DialError so that they can be retried safely.
func NewTransport(maxInFlight int64) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	idle := 64
	if maxInFlight > int64(idle) {
		idle = int(min(maxInFlight, 1024))
	}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &DialError{Err: err}
			}
			return c, nil
		},
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          idle * 2,
		MaxIdleConnsPerHost:   idle,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}
