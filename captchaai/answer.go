package captchaai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
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
	// "OK|", or the JSON "request" member (strings unquoted, other JSON
	// values as their compact text).
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
func ParseAnswer(body []byte) (Answer, error) {
	t := bytes.TrimSpace(body)
	if len(t) > 0 && t[0] == '{' {
		return parseJSONAnswer(body)
	}
	a := Answer{Raw: body, Format: FormatText}
	s := string(body)
	switch {
	case len(body) == 0:
		a.Status = StatusEmpty
	case s == NotReady:
		a.Status, a.Value = StatusNotReady, s
	case len(s) >= 3 && s[:3] == "OK|":
		a.Status, a.Value = StatusOK, s[3:]
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
	var m struct {
		Status  json.RawMessage `json:"status"`
		Request json.RawMessage `json:"request"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.Status == nil {
		return Answer{}, ErrNotProtocol
	}
	a := Answer{Raw: body, Format: FormatJSON, JSONValue: m.Request}
	if len(m.Request) > 0 && m.Request[0] == '"' {
		if err := json.Unmarshal(m.Request, &a.Value); err != nil {
			return Answer{}, ErrNotProtocol
		}
	} else if len(m.Request) > 0 {
		var c bytes.Buffer
		if err := json.Compact(&c, m.Request); err != nil {
			return Answer{}, ErrNotProtocol
		}
		a.Value = c.String()
	}
	status := string(bytes.Trim(m.Status, `"`))
	switch {
	case status == "1":
		a.Status = StatusOK
	case a.Value == NotReady:
		a.Status = StatusNotReady
	default:
		a.Status = StatusError
	}
	return a, nil
}

// isCode reports whether s looks like a protocol error code: upper-case
// letters, digits and underscores (ERROR_…, IP_BANNED, MAX_USER_TURN), or
// the "ERROR: 1001" throttle form.
func isCode(s string) bool {
	if len(s) < 3 || len(s) > 64 {
		return false
	}
	if len(s) > 7 && s[:7] == "ERROR: " {
		_, err := strconv.Atoi(s[7:])
		return err == nil
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return s[0] >= 'A' && s[0] <= 'Z'
}

func isDecimal(s string) bool {
	if len(s) > 32 {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// Terminal reports whether the answer ends a task: a solution, or an error
// that polling again cannot change.
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
// received it from upstream: Raw untouched when the formats match, else the
// equivalent body in f (a numeric JSON task ID stays numeric). Render is for
// in.php and res.php?action=get answers.
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
	req := a.JSONValue
	if req == nil {
		req, _ = json.Marshal(a.Value) // a string cannot fail to marshal
	}
	b := make([]byte, 0, len(req)+32)
	b = append(b, `{"status":`...)
	b = append(b, status...)
	b = append(b, `,"request":`...)
	b = append(b, req...)
	return append(b, '}')
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
