// Package proxy is solveonce's HTTP front: base-URL mode (clients call
// /in.php and /res.php on solveonce), forward-proxy mode (HTTP_PROXY /
// HTTPS_PROXY, with the CaptchaAI host intercepted and everything else
// passed through untouched), and the health endpoint.
//
// One listener serves both modes. Origin-form requests (GET /in.php) are
// base-URL mode. Absolute-form requests (GET http://host/path) and CONNECT
// are forward-proxy mode, in which a request is routed by its destination
// host name:
//
//   - an intercepted host (Config.InterceptHosts, by default
//     ocr.captchaai.com, on any port) is answered by the same Captcha handler
//     as base-URL mode: plain http directly, https by terminating TLS with a
//     leaf certificate signed by solveonce's own CA (MITM). solveonce never
//     connects to, nor resolves, an intercepted host; its upstream calls go
//     to the configured upstream base URL;
//   - any other host is passed through untouched (Config.OtherHosts
//     "tunnel"): CONNECT is spliced byte for byte to a port in
//     Config.ConnectPorts, with no certificate minted, and plain http is
//     forwarded with hop-by-hop headers removed (RFC 9110 §7.6.1), directly
//     or through Config.ParentProxy; or refused with 403 ("deny").
//
// Proxy-mode requests may require Basic proxy authentication (Config.AuthUser,
// Config.AuthPassword); base-URL mode never does, since it only ever talks
// to CaptchaAI on behalf of callers who hold an API key.
package proxy
