package pingback

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDefaultRule(t *testing.T) {
	r, err := ParseRule(nil)
	require.NoError(t, err)
	for addr, want := range map[string]bool{
		"127.0.0.1":              true,
		"::1":                    true,
		"10.1.2.3":               true,
		"192.168.1.1":            true,
		"93.184.216.34":          true,
		"2606:4700::1":           true,
		"169.254.169.254":        false, // AWS/GCP/Azure metadata
		"169.254.1.1":            false, // link-local
		"::ffff:169.254.169.254": false, // IPv4-mapped
		"fe80::1":                false,
		"fd00:ec2::254":          false, // AWS IPv6 metadata
		"100.100.100.200":        false, // Alibaba metadata
		"0.0.0.0":                false,
		"::":                     false,
		"224.0.0.1":              false,
		"255.255.255.255":        false,
	} {
		require.Equal(t, want, r.Allowed(addr, netip.MustParseAddr(addr)), addr)
	}
}

func TestExplicitRule(t *testing.T) {
	r, err := ParseRule([]string{"hooks.example.com", "*.cb.example.net", "10.0.0.0/8", "169.254.10.10"})
	require.NoError(t, err)
	pub := netip.MustParseAddr("93.184.216.34")
	require.True(t, r.Allowed("hooks.example.com", pub))
	require.True(t, r.Allowed("HOOKS.example.com.", pub))
	require.False(t, r.Allowed("other.example.com", pub))
	require.True(t, r.Allowed("a.b.cb.example.net", pub))
	require.False(t, r.Allowed("cb.example.net.evil.com", pub))
	require.True(t, r.Allowed("anything", netip.MustParseAddr("10.9.9.9")))
	require.False(t, r.Allowed("127.0.0.1", netip.MustParseAddr("127.0.0.1")), "loopback is not listed")
	require.False(t, r.Allowed("hooks.example.com", netip.MustParseAddr("169.254.169.254")),
		"a listed name resolving to metadata stays refused")
	require.True(t, r.Allowed("x", netip.MustParseAddr("169.254.10.10")), "an explicit IP re-allows a denied range")

	for _, bad := range []string{"", "10.0.0.0/33", "http://x", "user@host"} {
		_, err := ParseRule([]string{bad})
		require.Error(t, err, bad)
	}
}

func TestCheckURL(t *testing.T) {
	r, _ := ParseRule(nil)
	for raw, ok := range map[string]bool{
		"http://127.0.0.1:8080/cb?x=1":      true,
		"https://hooks.example.com/cb":      true,
		"http://169.254.169.254/latest":     false,
		"http://[fe80::1%25eth0]/cb":        false,
		"http://[::ffff:169.254.169.254]/":  false,
		"ftp://127.0.0.1/":                  false,
		"/relative":                         false,
		"http://user@169.254.169.254/":      false,
		"http://metadata.google.internal/x": true, // a name: checked at dial time
	} {
		_, err := r.CheckURL(raw)
		if ok {
			require.NoError(t, err, raw)
		} else {
			require.ErrorIs(t, err, ErrRefused, raw)
		}
	}
}

// The rule is applied to the resolved address at dial time: a host name
// that resolves to a refused address is refused, however the URL looked.
func TestDialTimeCheck(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	open, _ := ParseRule(nil)
	c, err := open.DialContext(time.Second)(ctx, "tcp", "localhost:"+port)
	require.NoError(t, err, "loopback is allowed by default")
	_ = c.Close()

	// Only 10/8 allowed: "localhost" passes the URL check (a name) but
	// resolves to loopback, which is refused when dialling.
	narrow, _ := ParseRule([]string{"10.0.0.0/8"})
	_, err = narrow.CheckURL("http://localhost:" + port + "/")
	require.NoError(t, err)
	_, err = narrow.DialContext(time.Second)(ctx, "tcp", "localhost:"+port)
	require.ErrorIs(t, err, ErrRefused)
	_, err = open.DialContext(time.Second)(ctx, "tcp", "169.254.169.254:80")
	require.ErrorIs(t, err, ErrRefused)

	// Through the delivery client too, and it is final (not retried).
	cfg := DefaultConfig()
	s := newSender(cfg, narrow, nil)
	defer s.close()
	err = s.send(ctx, "http://localhost:"+port+"/cb", "1", "x")
	var ae *attemptError
	require.True(t, errors.As(err, &ae))
	require.True(t, ae.refused)
	require.False(t, ae.retry)
}
