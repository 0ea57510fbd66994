package pingback

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Rule decides which pingback targets solveonce calls (pingback.allow).
//
// With no entries every address is allowed except the denied ones:
// link-local (169.254.0.0/16, fe80::/10), cloud metadata (169.254.169.254,
// fd00:ec2::254, 100.100.100.200, 192.0.0.192), multicast, unspecified and
// broadcast addresses. Loopback and private addresses are allowed, so a
// receiver on the same host or network works out of the box.
//
// With entries, a target is allowed when its resolved address lies in a
// listed IP or CIDR (which may also re-allow a denied address), or when its
// host name matches a listed name ("example.com" exactly; ".example.com" or
// "*.example.com" for any subdomain) and its address is not denied.
//
// The rule is applied to the address actually dialled, after name
// resolution, so a name that resolves (or is rebound) to a refused address
// is refused too.
type Rule struct {
	open     bool
	hosts    map[string]bool
	suffixes []string // ".example.com"
	prefixes []netip.Prefix
}

// metadata are cloud instance-metadata addresses outside the link-local
// ranges (AWS IPv6, Alibaba, Oracle).
var metadata = []netip.Addr{
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("192.0.0.192"),
	netip.MustParseAddr("169.254.169.254"),
}

// ParseRule parses pingback.allow entries.
func ParseRule(entries []string) (*Rule, error) {
	r := &Rule{open: len(entries) == 0, hosts: map[string]bool{}}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			return nil, fmt.Errorf("empty entry")
		case strings.Contains(e, "/"):
			p, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%q is not a CIDR: %w", e, err)
			}
			r.prefixes = append(r.prefixes, p.Masked())
		default:
			if a, err := netip.ParseAddr(e); err == nil {
				a = a.Unmap()
				r.prefixes = append(r.prefixes, netip.PrefixFrom(a, a.BitLen()))
				continue
			}
			name := strings.ToLower(strings.TrimPrefix(e, "*"))
			if strings.ContainsAny(name, ":@ ") || strings.Trim(name, ".") == "" {
				return nil, fmt.Errorf("%q is not a host name, IP or CIDR", e)
			}
			if strings.HasPrefix(name, ".") {
				r.suffixes = append(r.suffixes, strings.TrimSuffix(name, "."))
			} else {
				r.hosts[strings.TrimSuffix(name, ".")] = true
			}
		}
	}
	return r, nil
}

// denied reports whether a is refused unless explicitly listed.
func denied(a netip.Addr) bool {
	if a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsMulticast() || a.IsUnspecified() ||
		a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	for _, m := range metadata {
		if a == m {
			return true
		}
	}
	return false
}

// Allowed reports whether a connection to ip, reached through the URL host
// name host (an IP literal or a name), is allowed.
func (r *Rule) Allowed(host string, ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	for _, p := range r.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	if denied(ip) {
		return false
	}
	return r.open || r.nameAllowed(host)
}

func (r *Rule) nameAllowed(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if r.hosts[host] {
		return true
	}
	for _, s := range r.suffixes {
		if strings.HasSuffix(host, s) {
			return true
		}
	}
	return false
}

// CheckURL parses a pingback URL and refuses what can be refused before
// dialling: anything but an absolute http(s) URL with a host, and IP
// literals the rule refuses. Host names are checked at dial time, on the
// addresses they resolve to. Errors wrap ErrRefused.
func (r *Rule) CheckURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: not a URL", ErrRefused)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: not an http(s) URL with a host", ErrRefused)
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil && !r.Allowed(u.Hostname(), a) {
		return nil, fmt.Errorf("%w: %s", ErrRefused, a)
	}
	return u, nil
}

// DialContext returns a dial function that connects only to addresses the
// rule allows, checking every resolved address just before connecting (so
// a DNS answer cannot smuggle in a refused address).
func (r *Rule) DialContext(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("pingback: dial %s: %w", addr, err)
		}
		d := net.Dialer{
			Timeout:   timeout,
			KeepAlive: 30 * time.Second,
			Control: func(_, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return fmt.Errorf("%w: %s", ErrRefused, address)
				}
				if !r.Allowed(host, ap.Addr()) {
					return fmt.Errorf("%w: %s", ErrRefused, ap.Addr())
				}
				return nil
			},
		}
		return d.DialContext(ctx, network, addr)
	}
}
