package captchaai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// Status is the state an answer reports.
type Status uint8

const (
	// StatusOK is "OK|…" or {"status":1,…}: a task ID, a solution, a
	// balance.
	StatusOK Status = iota
	// StatusNotReady is CAPCHA_NOT_READY.
	StatusNotReady
	// StatusError is an error code such as ERROR_CAPTCHA_UNSOLVABLE.
	StatusError
	// StatusEmpty is an empty body, CaptchaAI's answer to a report.
	StatusEmpty
	// StatusRaw is a response that is not a protocol answer (an HTML error
	// page, an unknown action's reply), kept only to be passed through.
	StatusRaw
)

// NotReady is the protocol's (misspelled) "still solving" word.
const NotReady = "CAPCHA_NOT_READY"

// ErrNotProtocol is returned by ParseAnswer for bodies that are neither an
// answer nor an error code, such as the HTML 500/502 pages CaptchaAI
// sometimes serves.
var ErrNotProtocol = errors.New("captchaai: response is not a protocol answer")

// Answer is one response of CaptchaAI, parsed, with the bytes it came in.
type Answer struct {
	Status Status
	// Value is the task ID, solution, balance or error code: the text after
	// "OK|", or the JSON "request" member (strings unquoted, null or a
	// missing member as "", other JSON values as their compact text).
	Value string
	// JSONValue is the "request" member exactly as upstream sent it in JSON
	// (so a numeric task ID stays numeric); nil when the answer came as text.
	JSONValue json.RawMessage
	// Raw is the body as received; Format is its format.
	Raw    []byte
	Format Format
	// ContentType is the upstream Content-Type header ("" when synthesised).
	ContentType string
	// Bare is true for a plain-text success without the "OK|" prefix (the
	// getbalance answer).
	Bare bool
	// HTTPStatus is the upstream status code (0 when synthesised, meaning 200).
	HTTPStatus int
}

// ParseAnswer parses a response body of in.php or res.php in either format.
// Bodies that are not protocol answers give ErrNotProtocol.
//
// Text bodies: "OK|…" (everything after the first "OK|" is the value, '|'
// included), CAPCHA_NOT_READY, an error code (ERROR_…, IP_BANNED,
// MAX_USER_TURN, "ERROR: 1001"), a bare "OK" or "OK_…" word (2captcha's
// OK_REPORT_RECORDED) or a bare decimal (a balance), the last two Bare; an
// empty body (a report's answer) is StatusEmpty. Surrounding white space is
// ignored except in an "OK|" value, which is kept byte for byte.
//
// JSON bodies: an object with "status" (1 or "1" is success, anything else
// is not) and "request"; without success, "request" must be
// CAPCHA_NOT_READY or an error code. Member names are matched exactly and
// the last of repeated members wins, as in PHP.
func ParseAnswer(body []byte) (Answer, error) {
	t := bytes.TrimSpace(body)
	if len(t) > 0 && t[0] == '{' {
		return parseJSONAnswer(body)
	}
	a := Answer{Raw: body, Format: FormatText}
	switch s := string(t); {
	case len(t) == 0:
		a.Status = StatusEmpty
	case bytes.HasPrefix(body, []byte("OK|")):
		a.Status, a.Value = StatusOK, string(body[3:])
	case s == NotReady:
		a.Status, a.Value = StatusNotReady, s
	case isOKWord(s):
		a.Status, a.Value, a.Bare = StatusOK, s, true
	case isCode(s):
		a.Status, a.Value = StatusError, s
	case isDecimal(s):
		a.Status, a.Value, a.Bare = StatusOK, s, true
	default:
		return Answer{}, ErrNotProtocol
	}
	return a, nil
}

func parseJSONAnswer(body []byte) (Answer, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return Answer{}, ErrNotProtocol
	}
	status, ok := m["status"]
	if !ok {
		return Answer{}, ErrNotProtocol
	}
	req := m["request"]
	a := Answer{Raw: body, Format: FormatJSON, JSONValue: req}
	switch {
	case len(req) == 0 || string(req) == "null":
		// no value
	case req[0] == '"':
		if err := json.Unmarshal(req, &a.Value); err != nil {
			return Answer{}, ErrNotProtocol
		}
	default:
		var c bytes.Buffer
		if err := json.Compact(&c, req); err != nil {
			return Answer{}, ErrNotProtocol
		}
		a.Value = c.String()
	}
	isString := len(req) > 0 && req[0] == '"'
	switch {
	case string(status) == "1" || string(status) == `"1"`:
		a.Status = StatusOK
	case isString && a.Value == NotReady:
		a.Status = StatusNotReady
	case isString && isCode(a.Value):
		a.Status = StatusError
	default:
		return Answer{}, ErrNotProtocol
	}
	return a, nil
}

// isOKWord reports whether s is a bare success word: "OK" (2captcha's
// pingback actions) or "OK_…" (OK_REPORT_RECORDED).
func isOKWord(s string) bool {
	return s == "OK" || len(s) > 3 && len(s) <= 64 && strings.HasPrefix(s, "OK_") && codeChars(s)
}

// isCode reports whether s looks like a protocol error code: upper-case
// letters, digits and underscores starting with a letter (ERROR_…,
// IP_BANNED, MAX_USER_TURN), or the "ERROR: 1001" throttle form. Words
// starting with "OK" are never error codes.
func isCode(s string) bool {
	if len(s) < 3 || len(s) > 64 || strings.HasPrefix(s, "OK") {
		return false
	}
	if rest, ok := strings.CutPrefix(s, "ERROR: "); ok {
		return rest != "" && allDigits(rest)
	}
	return s[0] >= 'A' && s[0] <= 'Z' && codeChars(s)
}

// codeChars reports whether s has only upper-case letters, digits and
// underscores.
func codeChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isDecimal reports whether s is a balance as PHP prints a float: an
// optional minus, digits, optional fraction and exponent ("1.234",
// "-0.5", "1.0E-5"). Not "Inf", "NaN" or hex, which ParseFloat accepts.
func isDecimal(s string) bool {
	return len(s) <= 32 && s[0] != '+' && isPHPNumeric(s) && s[len(s)-1] != '.'
}

// Terminal reports whether a res.php?action=get answer ends the task: a
// solution (any StatusOK), or an error of ClassTerminal (unsolvable, unknown
// or expired task, …). CAPCHA_NOT_READY, empty and raw bodies, and every
// other error (throttles, server faults, key problems: about the request,
// not the task) are not terminal.
func (a Answer) Terminal() bool {
	switch a.Status {
	case StatusOK:
		return true
	case StatusError:
		return Classify(a.Value) == ClassTerminal
	}
	return false
}

// Render returns the answer as a client that asked for format f would have
// received it from upstream: Raw untouched when the formats match (so every
// extra JSON field, a numeric ID and error_text survive), else the
// equivalent body in f, never with a trailing newline:
//
//   - text: "OK|<value>" (a JSON object value as its compact text), the
//     bare value of a Bare answer, CAPCHA_NOT_READY, the bare code, or
//     nothing for an empty answer;
//   - JSON: {"status":1,"request":…} for success, {"status":0,"request":…}
//     otherwise, request being JSONValue when set (so a numeric task ID
//     stays numeric and an object stays an object) and the value as a JSON
//     string (invalid UTF-8 replaced by U+FFFD, <, > and & not escaped)
//     otherwise; nothing for an empty answer.
//
// Fields other than status and request cannot be derived from a text
// answer, nor can a JSON balance be told from a task ID (it renders as
// "OK|…"). Render is for in.php and res.php?action=get answers. The
// returned slice may be Raw itself: do not modify it.
func (a Answer) Render(f Format) []byte {
	if (f == a.Format || a.Status == StatusRaw) && a.Raw != nil {
		return a.Raw
	}
	if f == FormatText {
		switch a.Status {
		case StatusOK:
			if a.Bare {
				return []byte(a.Value)
			}
			return []byte("OK|" + a.Value)
		case StatusNotReady:
			return []byte(NotReady)
		case StatusEmpty:
			return []byte{}
		default:
			return []byte(a.Value)
		}
	}
	if a.Status == StatusEmpty {
		return []byte{}
	}
	status := "0"
	if a.Status == StatusOK {
		status = "1"
	}
	req := []byte(a.JSONValue)
	if len(req) == 0 {
		req = jsonString(a.Value)
	}
	b := make([]byte, 0, len(req)+32)
	b = append(b, `{"status":`...)
	b = append(b, status...)
	b = append(b, `,"request":`...)
	b = append(b, req...)
	return append(b, '}')
}

// jsonString encodes s as a JSON string without HTML escaping (PHP's
// json_encode does not escape <, > or & either).
func jsonString(s string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string cannot fail to encode
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// Text returns a synthesised answer carrying code (StatusError) or, for
// NotReady, StatusNotReady; render it with Render.
func Text(code string) Answer {
	if code == NotReady {
		return Answer{Status: StatusNotReady, Value: NotReady}
	}
	return Answer{Status: StatusError, Value: code}
}

// OK returns a synthesised success answer (task ID or solution).
func OK(value string) Answer { return Answer{Status: StatusOK, Value: value} }
