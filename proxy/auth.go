package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
)

// basicAuth checks Basic proxy credentials (RFC 9110 §11.7.2, RFC 7617).
type basicAuth struct {
	want [sha256.Size]byte // SHA-256 of "user:password": compared in constant time
}

func newBasicAuth(user, password string) *basicAuth {
	return &basicAuth{want: sha256.Sum256([]byte(user + ":" + password))}
}

// allow reports whether r carries the right Proxy-Authorization.
func (a *basicAuth) allow(r *http.Request) bool {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Proxy-Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return false
	}
	got := sha256.Sum256(dec)
	return subtle.ConstantTimeCompare(got[:], a.want[:]) == 1
}

// challenge answers 407 with the scheme the client must use.
func (a *basicAuth) challenge(w http.ResponseWriter) {
	w.Header().Set("Proxy-Authenticate", `Basic realm="solveonce", charset="UTF-8"`)
	http.Error(w, "solveonce: proxy authentication required", http.StatusProxyAuthRequired)
}
