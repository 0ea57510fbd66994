package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"sync"

	"github.com/elazarl/goproxy"
)

// handleConnect is goproxy's CONNECT hook. Only CONNECTs to intercepted
// hosts reach goproxy (serveConnect tunnels or refuses the rest), and each
// is MITM'd with a leaf from our CA.
func (s *Server) handleConnect(host string, ctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	st, _ := ctx.Req.Context().Value(tunnelKey{}).(*tunnelState)
	if st == nil || !s.hosts.match(host) {
		ctx.Resp = goproxy.NewResponse(ctx.Req, "text/plain; charset=utf-8", http.StatusForbidden, "solveonce: not an intercepted host\n")
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, host
	}
	ctx.UserData = st // goproxy copies it to every request in the tunnel
	return &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: s.mitm.tlsConfig}, host
}

// onRequest is goproxy's request hook. Inside a MITM'd tunnel every
// request, whatever its Host, is answered by the Captcha handler: nothing
// in such a tunnel is ever forwarded anywhere but the configured upstream.
// Plain-http requests to other hosts lose their hop-by-hop headers and go
// on.
func (s *Server) onRequest(req *http.Request, ctx *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	if st, ok := ctx.UserData.(*tunnelState); ok {
		return nil, s.answer(req, st)
	}
	if s.hosts.match(req.URL.Host) { // ServeHTTP answers these first; never forward one
		return nil, s.answer(req, nil)
	}
	s.log.Debug("forwarding", "method", req.Method, "host", req.URL.Host, "path", req.URL.Path)
	removeHopByHop(req.Header, isUpgrade(req.Header))
	return req, nil
}

// onResponse is goproxy's response hook: our own answers pass unchanged;
// a failed round trip becomes a 502 without internal detail; a forwarded
// response loses its hop-by-hop headers.
func (s *Server) onResponse(resp *http.Response, ctx *goproxy.ProxyCtx) *http.Response {
	if _, ok := ctx.UserData.(*tunnelState); ok {
		return resp
	}
	if resp == nil {
		err := ctx.Error
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error quotes the whole URL, query string included
		}
		s.log.Debug("forward failed", "host", ctx.Req.URL.Host, "path", ctx.Req.URL.Path, "err", err)
		return goproxy.NewResponse(ctx.Req, "text/plain; charset=utf-8", http.StatusBadGateway,
			"solveonce: cannot reach "+ctx.Req.URL.Host+"\n")
	}
	removeHopByHop(resp.Header, resp.StatusCode == http.StatusSwitchingProtocols)
	return resp
}

// answer turns the Captcha handler's reply to req into the response
// goproxy writes to the MITM'd (or plain) client. Delivery is confirmed to
// the layer once goproxy has written the whole body, exactly as base-URL
// mode does after a successful Write.
func (s *Server) answer(req *http.Request, st *tunnelState) *http.Response {
	s.Stats.Intercepted.Add(1)
	host := req.URL.Host
	if st != nil {
		host = st.host
		st.busy.Add(1)
	}
	s.log.Debug("intercepted", "scheme", req.URL.Scheme, "host", host, "path", req.URL.Path)
	rep, ok := s.captcha.answer(req)
	header := http.Header{}
	if ok {
		rep.fill(header)
	} else {
		rep = reply{status: http.StatusServiceUnavailable}
		header.Set("Content-Type", defaultTextType)
		header.Set("Content-Length", "0")
	}
	body := &replyBody{b: rep.body, done: func(delivered bool) {
		if delivered && rep.sub != nil {
			s.captcha.layer.Delivered(context.WithoutCancel(req.Context()), rep.sub)
		}
		if st != nil {
			st.busy.Add(-1)
		}
	}}
	return &http.Response{
		StatusCode:    rep.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        header,
		Body:          body,
		ContentLength: int64(len(rep.body)),
		Close:         !ok,
		Request:       req,
	}
}

// replyBody is a reply's body that tells done, once, on Close whether it
// was read to the end. It deliberately has no WriteTo: io.Copy must read
// it to EOF itself, which it does only after writing every earlier byte to
// the client without error.
type replyBody struct {
	b    []byte
	off  int
	eof  bool
	once sync.Once
	done func(delivered bool)
}

func (b *replyBody) Read(p []byte) (int, error) {
	if b.off >= len(b.b) {
		b.eof = true
		return 0, io.EOF
	}
	n := copy(p, b.b[b.off:])
	b.off += n
	return n, nil
}

func (b *replyBody) Close() error {
	b.once.Do(func() { b.done(b.eof) })
	return nil
}
