package captchaai

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strings"
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
	// PHP's $_REQUEST), without the API key and without file parts.
	Params url.Values
	Files  []File

	// The original request, replayed upstream unchanged.
	HTTPMethod string
	RawQuery   string
	Header     http.Header
	Body       []byte

	// Understood is false when the request could not be parsed reliably
	// (malformed form, multipart or JSON, unknown body type): such a request
	// is forwarded unchanged and never deduplicated, whatever its Kind.
	Understood bool

	key string // API key: unexported so it cannot be logged by accident
}

// Key returns the API key. Never log it; use Account.
func (r *Request) Key() string { return r.key }

// Account returns a short, stable, non-reversible name for the API key: safe
// in logs, cache keys and store keys (never use it as a metric label: it
// is unbounded).
func (r *Request) Account() string { return AccountOf(r.key) }

// AccountOf returns the account name of an API key (see Request.Account).
func AccountOf(key string) string {
	if key == "" {
		return "nokey"
	}
	sum := sha256.Sum256([]byte("solveonce-account\x00" + key))
	return hex.EncodeToString(sum[:8])
}

// ParseRequest reads r (its body at most maxBody bytes) and parses it. The
// body is consumed; Request.Body holds a copy. Errors are limited to
// ErrBodyTooLarge and read failures; anything malformed yields a Request
// with Understood false, to be forwarded as it is.
func ParseRequest(r *http.Request, maxBody int64) (*Request, error) {
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength > maxBody {
			return nil, ErrBodyTooLarge
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
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
func Parse(method, urlPath, rawQuery string, header http.Header, body []byte) *Request {
	req := &Request{
		Path:       urlPath,
		HTTPMethod: method,
		RawQuery:   rawQuery,
		Header:     header,
		Body:       body,
		Understood: true,
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		req.Understood = false
	}
	params := query
	if len(body) > 0 {
		form, files, ok := parseBody(header.Get("Content-Type"), body)
		if !ok {
			req.Understood = false
		}
		req.Files = files
		for k, v := range form {
			params[k] = v // body wins, as PHP's $_REQUEST does by default
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

// parseBody decodes a request body the way upstream reads it. ok is false
// when the body is of a type upstream would not read as parameters or is
// malformed.
func parseBody(contentType string, body []byte) (url.Values, []File, bool) {
	mt, mp, err := mime.ParseMediaType(contentType)
	if contentType == "" {
		mt, err = "", nil
	}
	if err != nil {
		return nil, nil, false
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
		name := p.FormName()
		if name == "" {
			continue
		}
		if fn := p.FileName(); fn != "" {
			files = append(files, File{Field: name, Name: fn, Data: data})
			continue
		}
		form.Add(name, string(data))
	}
}

// parseJSON reads a flat JSON object into parameters, turning numbers into
// their literal text, true into "1" and false into "" (as PHP's string
// conversion does) and nested values into their compact JSON text.
func parseJSON(body []byte) (url.Values, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var m map[string]json.RawMessage
	if err := dec.Decode(&m); err != nil || len(m) > maxParts {
		return nil, false
	}
	if dec.More() {
		return nil, false
	}
	v := make(url.Values, len(m))
	for k, raw := range m {
		raw = bytes.TrimSpace(raw)
		switch {
		case len(raw) == 0:
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, false
			}
			v.Set(k, s)
		case bytes.Equal(raw, []byte("true")):
			v.Set(k, "1")
		case bytes.Equal(raw, []byte("false")), bytes.Equal(raw, []byte("null")):
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
