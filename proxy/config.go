package proxy

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Config configures the proxy front.
type Config struct {
	// Listen is the proxy's address; "" → 127.0.0.1:8080 (loopback unless
	// configured otherwise).
	Listen string `toml:"listen"`
	// MaxBody bounds a request body solveonce reads; 0 → 2 MiB. Larger
	// in.php bodies get ERROR_TOO_BIG_CAPTCHA_FILESIZE.
	MaxBody int64 `toml:"max_body"`
	// CACert and CAKey are the MITM certificate authority's PEM files,
	// created (key mode 0600) when absent; "" → ca.pem / ca-key.pem in the
	// data directory (DataDir).
	CACert string `toml:"ca_cert"`
	CAKey  string `toml:"ca_key"`

	// InterceptHosts are the host names answered by solveonce in
	// forward-proxy mode, matched case-insensitively on any port; empty →
	// ["ocr.captchaai.com"].
	InterceptHosts []string `toml:"intercept_hosts"`
	// OtherHosts says what happens to every other host in forward-proxy
	// mode: "tunnel" (CONNECT spliced untouched, plain http forwarded) or
	// "deny" (403); "" → "tunnel".
	OtherHosts string `toml:"other_hosts"`
	// ConnectPorts are the ports a CONNECT to another host may reach;
	// empty → [443, 80]. Intercepted hosts are answered locally on any port.
	ConnectPorts []int `toml:"connect_ports"`
	// ParentProxy carries the traffic to other hosts: an http://, https://,
	// socks5:// or socks5h:// URL (credentials in the URL), "env" for the
	// process's HTTP_PROXY / HTTPS_PROXY / NO_PROXY, or "" for direct
	// connections. solveonce never reads those variables otherwise.
	ParentProxy string `toml:"parent_proxy"`
	// ParentProxyUpstream sends solveonce's own calls to CaptchaAI through
	// ParentProxy too (see ParentProxyFunc); false → direct.
	ParentProxyUpstream bool `toml:"parent_proxy_upstream"`
	// AuthUser and AuthPassword, when set, require Basic proxy
	// authentication (Proxy-Authorization) on every forward-proxy request;
	// "" → none. Keep the password out of the file: SOLVEONCE_PROXY_AUTH_PASSWORD.
	AuthUser     string `toml:"auth_user"`
	AuthPassword string `toml:"auth_password"`

	// DataDir is where CACert and CAKey default to. It is not a proxy key:
	// main sets it from the top-level data_dir.
	DataDir string `toml:"-"`
}

// Values of Config.OtherHosts.
const (
	OtherHostsTunnel = "tunnel"
	OtherHostsDeny   = "deny"
)

// DefaultInterceptHost is the CaptchaAI API host.
const DefaultInterceptHost = "ocr.captchaai.com"

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxBody <= 0 {
		c.MaxBody = 2 << 20
	}
	if len(c.InterceptHosts) == 0 {
		c.InterceptHosts = []string{DefaultInterceptHost}
	}
	if c.OtherHosts == "" {
		c.OtherHosts = OtherHostsTunnel
	}
	if len(c.ConnectPorts) == 0 {
		c.ConnectPorts = []int{443, 80}
	}
	return c
}

// Validate checks the forward-proxy keys of c (defaults applied) and names
// every bad one as "proxy.<key>: problem".
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("proxy.%s: %s", key, fmt.Sprintf(format, a...)))
	}
	for _, h := range c.InterceptHosts {
		if !validHost(h) {
			bad("intercept_hosts", "%q is not a host name", h)
		}
	}
	switch c.OtherHosts {
	case OtherHostsTunnel, OtherHostsDeny:
	default:
		bad("other_hosts", "must be %q or %q, not %q", OtherHostsTunnel, OtherHostsDeny, c.OtherHosts)
	}
	for _, p := range c.ConnectPorts {
		if p < 1 || p > 65535 {
			bad("connect_ports", "%d is not a TCP port", p)
		}
	}
	if _, err := parseParent(c.ParentProxy); err != nil {
		bad("parent_proxy", "%v", err)
	}
	if c.ParentProxyUpstream && c.ParentProxy == "" {
		bad("parent_proxy_upstream", "needs parent_proxy")
	}
	if (c.AuthUser == "") != (c.AuthPassword == "") {
		bad("auth_user", "auth_user and auth_password (or SOLVEONCE_PROXY_AUTH_PASSWORD) must be set together")
	}
	if strings.Contains(c.AuthUser, ":") {
		bad("auth_user", "must not contain ':'")
	}
	return errors.Join(errs...)
}

// CAFiles returns the CA certificate and key paths in effect: CACert and
// CAKey, or ca.pem and ca-key.pem in DataDir when they are empty.
func (c Config) CAFiles() (cert, key string, err error) {
	cert, key = c.CACert, c.CAKey
	if (cert == "" || key == "") && c.DataDir == "" {
		return "", "", errors.New("proxy: no data directory for the MITM CA: set data_dir, or proxy.ca_cert and proxy.ca_key")
	}
	if cert == "" {
		cert = filepath.Join(c.DataDir, "ca.pem")
	}
	if key == "" {
		key = filepath.Join(c.DataDir, "ca-key.pem")
	}
	return cert, key, nil
}
