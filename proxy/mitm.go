package proxy

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"golang.org/x/sync/singleflight"
)

// mitm mints and caches leaf certificates for intercepted hosts: one
// generation per host however many handshakes ask at once.
type mitm struct {
	ca        *CA
	hosts     hostSet
	now       func() time.Time
	group     singleflight.Group
	generated atomic.Int64 // leaves signed, for tests and metrics

	mu     sync.Mutex // guards leaves
	leaves map[string]*tls.Certificate
}

func newMITM(ca *CA, hosts hostSet) *mitm {
	return &mitm{ca: ca, hosts: hosts, now: time.Now, leaves: map[string]*tls.Certificate{}}
}

// leaf returns the cached certificate for host (normalised), signing one
// if there is none or it is about to expire.
func (m *mitm) leaf(host string) (*tls.Certificate, error) {
	if c := m.cached(host); c != nil {
		return c, nil
	}
	v, err, _ := m.group.Do(host, func() (any, error) {
		if c := m.cached(host); c != nil { // look again inside the flight
			return c, nil
		}
		c, err := m.ca.Sign(host, m.now())
		if err != nil {
			return nil, err
		}
		m.generated.Add(1)
		m.mu.Lock()
		if len(m.leaves) >= maxLeaves {
			clear(m.leaves)
		}
		m.leaves[host] = c
		m.mu.Unlock()
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*tls.Certificate), nil
}

func (m *mitm) cached(host string) *tls.Certificate {
	m.mu.Lock()
	c := m.leaves[host]
	m.mu.Unlock()
	if c != nil && m.now().Add(leafRenewBefore).Before(c.Leaf.NotAfter) {
		return c
	}
	return nil
}

// tlsConfig is goproxy's ConnectAction.TLSConfig hook: the server side of
// a MITM'd tunnel to host. The certificate follows the client's SNI (or
// the CONNECT host without one), and only intercepted names get one.
func (m *mitm) tlsConfig(host string, _ *goproxy.ProxyCtx) (*tls.Config, error) {
	connectHost := normalizeHost(hostOnly(host))
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := connectHost
			if hello.ServerName != "" {
				name = normalizeHost(hello.ServerName)
			}
			if !m.hosts.match(name) {
				return nil, fmt.Errorf("proxy: no certificate for %q: not an intercepted host", name)
			}
			return m.leaf(name)
		},
	}, nil
}
