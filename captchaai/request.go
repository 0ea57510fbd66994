package captchaai

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strings"
	"unicode/utf8"
)

// ErrBodyTooLarge is returned by ParseRequest when the body exceeds the
// limit. The proxy answers it with the protocol's own error (see TooLarge).
var ErrBodyTooLarge = errors.New("captchaai: request body too large")

// maxParts bounds the number of multipart parts and JSON members parsed, so
// a hostile body cannot make parsing quadratic or huge.
const maxParts = 1000

// File is one uploaded multipart file part.
type File struct {
	Field string // form field name, e.g. "file", "imginstructions", "file_1"
	Name  string // the part's filename as sent
	Data  []byte
}

// Request is one client request to CaptchaAI, parsed for deduplication and
// kept whole for verbatim forwarding.
type Request struct {
	Kind   Kind
	Format Format
	ACAO   bool   // header_acao=1: answer carries Access-Control-Allow-Origin: *
	Path   string // URL path as the client sent it, e.g. "/in.php"
	Method string // in.php method as sent ("post", "base64", "userrecaptcha", …)
	Action string // res.php action
	ID     string // res.php id
	IDs    []string

	// Params holds the merged query and body parameters (body wins, as in
	// PHP's $_REQUEST), without the API key and without file parts. As in
	// PHP, a repeated name keeps only its last value, except names ending
	// in "[]". JSON numbers are their literal text, true is "1", false and
	// null are "".
	Params url.Values
	Files  []File

	// The original request, replayed upstream unchanged.
	HTTPMethod string
	RawQuery   string
	Header     http.Header
	Body       []byte

	// Understood is false when the request could not be parsed reliably
	// (malformed query, form, multipart or JSON, unknown body type, a body
	// on a method other than POST): such a request is forwarded unchanged
	// and never deduplicated, whatever its Kind.
	Understood bool

	key string // API key: unexported so it cannot be logged by accident
}

// Key returns the API key. Never log it; use Account.
func (r *Request) Key() string { return r.key }

// Account returns a short, stable, non-reversible name for the API key: safe
// in logs, cache keys and store keys (never use it as a metric label: it
// is unbounded).
func (r *Request) Account() string { return AccountOf(r.key) }

// AccountOf returns the account name of an API key (see Request.Account):
// 16 hex digits of a salted SHA-256, or "nokey" for the empty key.
func AccountOf(key string) string {
	if key == "" {
		return "nokey"
	}
	sum := accountSum(key)
	return hex.EncodeToString(sum[:accountBytes])
}

// accountBytes is how much of the account hash an account name keeps.
const accountBytes = 8

func accountSum(key string) [sha256.Size]byte {
	const salt = "solveonce-account\x00"
	var stack [128]byte
	return sha256.Sum256(append(append(stack[:0], salt...), key...))
}

// ParseRequest reads r (its body at most maxBody bytes) and parses it. The
// body is consumed; Request.Body holds a copy. Errors are limited to
// ErrBodyTooLarge (announced by Content-Length or found while reading) and
// read failures; anything malformed yields a Request with Understood false,
// to be forwarded as it is.
func ParseRequest(r *http.Request, maxBody int64) (*Request, error) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength > maxBody {
			return nil, ErrBodyTooLarge
		}
		limit := maxBody
		if limit < math.MaxInt64 {
			limit++ // read one byte more to tell "exactly maxBody" from "more"
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, limit))
		if err != nil {
			return nil, fmt.Errorf("captchaai: read body: %w", err)
		}
		if int64(len(b)) > maxBody {
			return nil, ErrBodyTooLarge
		}
		body = b
	}
	return Parse(r.Method, r.URL.Path, r.URL.RawQuery, r.Header, body), nil
}

// Parse parses a request from its parts. It never fails: what it cannot
// understand is marked Understood false.
//
// Parameters are read the way PHP fills $_REQUEST, which is how upstream
// appears to read them: query first, then the body of a POST, the body
// winning on conflict; within one source the last occurrence of a name wins
// (except names ending in "[]", which PHP collects into an array, so all of
// their values are kept). A body sent with any other HTTP method is not read
// by PHP, so such a request is marked not understood and its body ignored.
func Parse(method, urlPath, rawQuery string, header http.Header, body []byte) *Request {
	req := &Request{
		Path:       urlPath,
		HTTPMethod: method,
		RawQuery:   rawQuery,
		Header:     header,
		Body:       body,
		Understood: true,
	}
	params, err := url.ParseQuery(rawQuery)
	if err != nil {
		// Go rejects what PHP may read differently (';' separators, bad
		// escapes): never deduplicate on a guess.
		req.Understood = false
	}
	lastWins(params)
	if len(body) > 0 {
		if method != http.MethodPost {
			req.Understood = false
		} else {
			form, files, ok := parseBody(header.Get("Content-Type"), body)
			if !ok {
				req.Understood = false
			}
			lastWins(form)
			req.Files = files
			for k, v := range form {
				params[k] = v // body wins, as PHP's $_REQUEST does by default
			}
		}
	}
	req.key = params.Get("key")
	params.Del("key")
	req.Params = params
	req.Format = FormatText
	if truthy(params.Get("json")) {
		req.Format = FormatJSON
	}
	req.ACAO = truthy(params.Get("header_acao"))

	// Route by path, never by the presence of "action": in.php has an
	// action parameter of its own (reCAPTCHA v3, Turnstile).
	switch path.Base(urlPath) {
	case "in.php":
		req.Kind = KindSubmit
		req.Method = params.Get("method")
	case "res.php":
		req.Action = params.Get("action")
		req.ID = params.Get("id")
		switch req.Action {
		case "get":
			if ids := params.Get("ids"); ids != "" && req.ID == "" {
				req.Kind = KindMultiResult
				req.IDs = strings.Split(ids, ",")
			} else {
				req.Kind = KindResult
			}
		case "getbalance":
			req.Kind = KindBalance
		case "reportbad", "reportgood":
			req.Kind = KindReport
		default:
			req.Kind = KindOther
		}
	default:
		req.Kind = KindOther
	}
	return req
}

// lastWins keeps only the last value of every name, as PHP does, except for
// names ending in "[]" (PHP arrays), which keep all of their values.
func lastWins(v url.Values) {
	for k, vs := range v {
		if len(vs) > 1 && !strings.HasSuffix(k, "[]") {
			v[k] = vs[len(vs)-1:]
		}
	}
}

// parseBody decodes a request body the way upstream reads it. ok is false
// when the body is of a type upstream would not read as parameters or is
// malformed.
func parseBody(contentType string, body []byte) (url.Values, []File, bool) {
	mt, mp := "", map[string]string(nil)
	if contentType != "" {
		var err error
		if mt, mp, err = mime.ParseMediaType(contentType); err != nil {
			return nil, nil, false
		}
	}
	switch mt {
	case "application/x-www-form-urlencoded":
		v, err := url.ParseQuery(string(body))
		return v, nil, err == nil
	case "multipart/form-data":
		return parseMultipart(mp["boundary"], body)
	case "application/json", "text/plain", "":
		if t := bytes.TrimSpace(body); len(t) > 0 && t[0] == '{' {
			v, ok := parseJSON(t)
			return v, nil, ok
		}
		return nil, nil, false
	default:
		return nil, nil, false
	}
}

// parseMultipart reads a multipart/form-data body part by part, raw: no
// Content-Transfer-Encoding (quoted-printable) is decoded, as PHP does not
// either. A part whose Content-Disposition has a filename parameter (even
// an empty one) is a file, as for PHP's $_FILES; its name is kept exactly
// as sent (mime/multipart's FileName would strip directories).
func parseMultipart(boundary string, body []byte) (url.Values, []File, bool) {
	if boundary == "" {
		return nil, nil, false
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	form := url.Values{}
	var files []File
	for n := 0; ; n++ {
		if n >= maxParts {
			return nil, nil, false
		}
		p, err := mr.NextRawPart()
		if err == io.EOF {
			return form, files, true
		}
		if err != nil {
			return nil, nil, false
		}
		data, err := io.ReadAll(p)
		if err != nil {
			return nil, nil, false
		}
		disp, dp, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		if err != nil || disp != "form-data" {
			// A part we cannot name might be a parameter upstream reads:
			// ignoring it could make different requests look the same.
			return nil, nil, false
		}
		name := dp["name"]
		if name == "" {
			continue // PHP ignores unnamed parts too
		}
		if fn, ok := dp["filename"]; ok {
			files = append(files, File{Field: name, Name: fn, Data: data})
			continue
		}
		form.Add(name, string(data))
	}
}

// parseJSON reads a flat JSON object into parameters, turning numbers into
// their literal text, true into "1" and false and null into "" (as PHP's
// string conversion does) and nested values into their compact JSON text.
// Like PHP's json_decode it rejects invalid UTF-8 and trailing data, and a
// repeated member's last value wins.
func parseJSON(body []byte) (url.Values, bool) {
	if !utf8.Valid(body) {
		// encoding/json would turn every bad byte into U+FFFD, making
		// different bodies equal; PHP refuses them.
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || len(m) > maxParts {
		return nil, false
	}
	v := make(url.Values, len(m))
	for k, raw := range m {
		switch {
		case len(raw) == 0:
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, false
			}
			v.Set(k, s)
		case string(raw) == "true":
			v.Set(k, "1")
		case string(raw) == "false", string(raw) == "null":
			v.Set(k, "")
		default:
			var c bytes.Buffer
			if err := json.Compact(&c, raw); err != nil {
				return nil, false
			}
			v.Set(k, c.String())
		}
	}
	return v, true
}
