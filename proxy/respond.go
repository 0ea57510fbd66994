package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/solveonce/solveonce/captchaai"
	"github.com/solveonce/solveonce/intercept"
)

// Header is the diagnostic response header saying how solveonce answered:
// miss, hit, shared or replayed.
const Header = "X-Solveonce"

// Default content types for answers solveonce synthesises before it has
// seen upstream's own (it then reuses upstream's, per format).
const (
	defaultTextType = "text/plain; charset=utf-8"
	defaultJSONType = "application/json"
)

// retryAfterer is implemented by upstream errors that know how long a
// client should wait (breaker open, rate limited, paused key).
type retryAfterer interface{ RetryAfter() time.Duration }

// Captcha answers CaptchaAI requests through the deduplicating layer. It
// serves base-URL mode directly and requests decrypted from MITM'd tunnels.
type Captcha struct {
	layer   *intercept.Layer
	maxBody int64
	types   [2]atomic.Pointer[string] // last upstream Content-Type per format
	// Answered counts answers by outcome (index: intercept.Outcome).
	Answered [4]atomic.Int64
}

// NewCaptcha returns a handler over layer reading bodies up to maxBody
// (0 → 2 MiB).
func NewCaptcha(layer *intercept.Layer, maxBody int64) *Captcha {
	if maxBody <= 0 {
		maxBody = 2 << 20
	}
	return &Captcha{layer: layer, maxBody: maxBody}
}

// reply is an answer ready to write. Its headers are kept as fields and
// written straight into the response's header map (fill), so the hot path
// builds no intermediate map.
type reply struct {
	status      int
	contentType string // "" → no Content-Type (CaptchaAI's empty report answer)
	acao        bool   // Access-Control-Allow-Origin: *
	retryAfter  int    // seconds; 0 → no Retry-After
	body        []byte
	sub         *intercept.Submission // to confirm delivery after the write
	outcome     intercept.Outcome
}

// fill writes the reply's headers into h.
func (rep *reply) fill(h http.Header) {
	if rep.contentType != "" {
		h["Content-Type"] = []string{rep.contentType}
	}
	if rep.acao {
		h["Access-Control-Allow-Origin"] = []string{"*"}
	}
	if rep.retryAfter > 0 {
		h["Retry-After"] = []string{strconv.Itoa(rep.retryAfter)}
	}
	h[Header] = []string{rep.outcome.String()}
	h["Content-Length"] = []string{strconv.Itoa(len(rep.body))}
}

// ServeHTTP answers one CaptchaAI request (base-URL mode).
func (c *Captcha) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rep, ok := c.answer(r)
	if !ok {
		return // the client left; nobody to answer
	}
	rep.fill(w.Header())
	w.WriteHeader(rep.status)
	_, err := w.Write(rep.body)
	if err == nil && rep.sub != nil {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		c.layer.Delivered(context.WithoutCancel(r.Context()), rep.sub)
	}
}

// answer computes the reply to r. ok is false when the client went away
// before there was anything to say.
func (c *Captcha) answer(r *http.Request) (reply, bool) {
	ctx := r.Context()
	req, err := captchaai.ParseRequest(r, c.maxBody)
	if err != nil {
		f := captchaai.FormatText
		if r.URL.Query().Get("json") == "1" {
			f = captchaai.FormatJSON
		}
		code := captchaai.CodeBadParameters
		if errors.Is(err, captchaai.ErrBodyTooLarge) && isSubmitPath(r.URL.Path) {
			code = captchaai.CodeTooBig
		}
		return c.local(f, r.URL.Query().Get("header_acao") == "1", captchaai.Text(code), http.StatusOK, 0), true
	}
	var (
		ans captchaai.Answer
		out intercept.Outcome
		sub *intercept.Submission
	)
	switch req.Kind {
	case captchaai.KindSubmit:
		sub, err = c.layer.Submit(ctx, req)
		if sub != nil {
			ans, out = sub.Answer, sub.Outcome
		}
	case captchaai.KindResult:
		ans, out, err = c.layer.Result(ctx, req)
	case captchaai.KindReport:
		ans, out, err = c.layer.Report(ctx, req)
	default:
		ans, out, err = c.layer.Forward(ctx, req)
	}
	if err != nil {
		if ctx.Err() != nil {
			return reply{}, false
		}
		if errors.Is(err, intercept.ErrIdempotencyMismatch) {
			a := captchaai.Text(captchaai.CodeBadParameters)
			return c.local(req.Format, req.ACAO, a, http.StatusUnprocessableEntity, 0), true
		}
		// Fail fast in words every client already understands (protocol
		// doc §8.6): in.php "retry later"; a poll "keep polling".
		wait := 5 * time.Second
		var ra retryAfterer
		if errors.As(err, &ra) && ra.RetryAfter() > 0 {
			wait = ra.RetryAfter()
		}
		a := captchaai.Text(captchaai.CodeNoSlot)
		if req.Kind == captchaai.KindResult {
			a = captchaai.Text(captchaai.NotReady)
		}
		return c.local(req.Format, req.ACAO, a, http.StatusOK, wait), true
	}
	rep := c.render(req, ans, out)
	rep.sub = sub
	return rep, true
}

// render turns an answer into the reply this client would have had from
// CaptchaAI: its own format, upstream's Content-Type, header_acao honoured.
func (c *Captcha) render(req *captchaai.Request, ans captchaai.Answer, out intercept.Outcome) reply {
	c.Answered[out].Add(1)
	status := http.StatusOK
	if ans.Status == captchaai.StatusRaw && ans.HTTPStatus != 0 {
		status = ans.HTTPStatus
	}
	ct := ans.ContentType
	if ct != "" && ans.Status != captchaai.StatusRaw {
		c.types[ans.Format].Store(&ct)
	}
	if ans.Format != req.Format && ans.Status != captchaai.StatusRaw || ct == "" {
		ct = c.contentType(req.Format)
	}
	if ans.Status == captchaai.StatusEmpty && ans.ContentType == "" {
		ct = ""
	}
	return reply{status: status, contentType: ct, acao: req.ACAO, body: ans.Render(req.Format), outcome: out}
}

// local is a reply solveonce makes up itself.
func (c *Captcha) local(f captchaai.Format, acao bool, a captchaai.Answer, status int, retryAfter time.Duration) reply {
	c.Answered[intercept.Hit].Add(1)
	return reply{
		status:      status,
		contentType: c.contentType(f),
		acao:        acao,
		retryAfter:  int((retryAfter + time.Second - 1) / time.Second),
		body:        a.Render(f),
		outcome:     intercept.Hit,
	}
}

func (c *Captcha) contentType(f captchaai.Format) string {
	if p := c.types[f].Load(); p != nil {
		return *p
	}
	if f == captchaai.FormatJSON {
		return defaultJSONType
	}
	return defaultTextType
}

func isSubmitPath(p string) bool {
	return len(p) >= 6 && p[len(p)-6:] == "in.php"
}
