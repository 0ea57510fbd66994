package proxy

import (
	"net"
	"net/http"
	"strings"
)

// hostSet is the set of intercepted host names, normalised by
// normalizeHost. It is read-only after construction.
type hostSet map[string]struct{}

func newHostSet(hosts []string) hostSet {
	s := make(hostSet, len(hosts))
	for _, h := range hosts {
		if n := normalizeHost(h); n != "" {
			s[n] = struct{}{}
		}
	}
	return s
}

// match reports whether hostport ("host", "host:port", "[v6]:port") names
// an intercepted host, on any port, ignoring case and a trailing dot.
func (s hostSet) match(hostport string) bool {
	if len(s) == 0 {
		return false
	}
	_, ok := s[normalizeHost(hostOnly(hostport))]
	return ok
}

// hostOnly strips the port from host:port, and the brackets from an IPv6
// literal; a string without a port comes back whole.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

// normalizeHost lower-cases a host name and drops a trailing dot and IPv6
// brackets, so that OCR.CaptchaAI.com. and ocr.captchaai.com compare equal.
func normalizeHost(h string) string {
	h = strings.TrimSpace(h)
	h = strings.TrimPrefix(h, "[")
	h = strings.TrimSuffix(h, "]")
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}

// validHost reports whether h can be an intercept_hosts entry: a host name
// or an IP literal, without scheme, port or path.
func validHost(h string) bool {
	n := normalizeHost(h)
	if n == "" {
		return false
	}
	if net.ParseIP(n) != nil {
		return true
	}
	return !strings.ContainsAny(n, "/:@ ?#[]")
}

// isLoopbackAddr reports whether a listen address accepts loopback
// connections only: 127.0.0.0/8, ::1 or localhost. ":8080" and 0.0.0.0 are
// not.
func isLoopbackAddr(addr string) bool {
	host := hostOnly(addr)
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// isSelf reports whether target (host:port) is the address r arrived on, so
// that a proxied request to solveonce itself is answered instead of looping.
func isSelf(r *http.Request, target string) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		target = net.JoinHostPort(target, "80")
	}
	return sameEndpoint(local.String(), target)
}

// sameEndpoint reports whether dst (host:port) reaches the listener at
// listen (host:port; an empty or unspecified host listens everywhere).
func sameEndpoint(listen, dst string) bool {
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	dhost, dport, err := net.SplitHostPort(dst)
	if err != nil || dport != lport {
		return false
	}
	lhost, dhost = normalizeHost(lhost), normalizeHost(dhost)
	if lhost == dhost {
		return true
	}
	lip, dip := net.ParseIP(lhost), net.ParseIP(dhost)
	local := dhost == "localhost" || dip != nil && dip.IsLoopback()
	switch {
	case lhost == "" || lip != nil && lip.IsUnspecified():
		return local // listening everywhere: loopback is certainly us
	case lhost == "localhost":
		return local
	case lip != nil && lip.IsLoopback():
		return dhost == "localhost"
	}
	return false
}
