package captchaaitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/solveonce/solveonce/captchaai"
)

// replyKind is how a request ends.
type replyKind uint8

const (
	replyWrite  replyKind = iota // an HTTP response
	replyReset                   // connection reset, no response
	replyRefuse                  // outage: connection refused
	replyAbort                   // the wait ended (client gone or Server closing): no response
)

// reply is the outcome of serving one request, independent of whether it
// came over HTTP or through Transport.
type reply struct {
	kind   replyKind
	status int
	header http.Header
	body   []byte
	err    error // why a replyAbort ended
}

// HTML error pages served by FaultHTML500 and FaultHTML502, in the style of
// the nginx pages CaptchaAI's front end serves.
const (
	html500 = "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
	html502 = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)

// Protocol codes the fake answers with.
const (
	codeWrongUserKey  = "ERROR_WRONG_USER_KEY"
	codeNoSlot        = "ERROR_NO_SLOT_AVAILABLE"
	codeServerError   = "ERROR_SERVER_ERROR"
	codeBadParameters = "ERROR_BAD_PARAMETERS"
	codeZeroFilesize  = "ERROR_ZERO_CAPTCHA_FILESIZE"
	codeTooBig        = "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
	codeUpload        = "ERROR_UPLOAD"
	codeWrongGoogle   = "ERROR_WRONG_GOOGLEKEY"
	codePageURL       = "ERROR_PAGEURL"
	codeWrongIDFormat = "ERROR_WRONG_ID_FORMAT"
	codeWrongID       = "ERROR_WRONG_CAPTCHA_ID"
	codeEmptyAction   = "ERROR_EMPTY_ACTION"
)

// errorTexts are the human descriptions ErrorText adds (2captcha wording).
var errorTexts = map[string]string{
	codeWrongUserKey:           "You've provided key parameter value in incorrect format, it should contain 32 symbols.",
	"ERROR_KEY_DOES_NOT_EXIST": "The key you've provided does not exists.",
	"ERROR_ZERO_BALANCE":       "You don't have free threads.",
	codeNoSlot:                 "No slot available: all threads are busy, retry later.",
	codeServerError:            "Internal server error, retry later.",
	codeBadParameters:          "Some required parameters are missing or have a wrong format.",
	codeZeroFilesize:           "Image size is less than 100 bytes.",
	codeTooBig:                 "Image size is more than 100 kB.",
	codeUpload:                 "Server can't get file data from your POST-request.",
	codeWrongGoogle:            "googlekey parameter is missing or has a wrong format.",
	codePageURL:                "pageurl parameter is missing in your request.",
	codeWrongIDFormat:          "You've provided captcha ID in wrong format. The ID can contain numbers only.",
	codeWrongID:                "You've provided incorrect captcha ID.",
	codeEmptyAction:            "Action parameter is missing or no value is provided for action parameter.",
	"ERROR_CAPTCHA_UNSOLVABLE": "We are unable to solve your captcha.",
	"MAX_USER_TURN":            "You made more than 60 requests to in.php within 3 seconds.",
	"IP_BANNED":                "Your IP address is banned due to many frequent attempts to access the server using wrong authorization keys.",
}

func errorText(code string) string {
	if t, ok := errorTexts[code]; ok {
		return t
	}
	return "Error: " + code
}

// serve answers one request; it never writes anything itself.
func (s *Server) serve(r *http.Request) reply {
	s.requests.Add(1)
	if s.outage.Load() {
		s.refused.Add(1)
		return reply{kind: replyRefuse}
	}
	ctx := r.Context()
	req, err := captchaai.ParseRequest(r, s.cfg.maxBody)
	if err != nil {
		if !errors.Is(err, captchaai.ErrBodyTooLarge) {
			return reply{kind: replyReset, err: err}
		}
		// The body was not parsed: the query alone says how to answer.
		req = captchaai.Parse(r.Method, r.URL.Path, r.URL.RawQuery, r.Header, nil)
		if req.Kind == captchaai.KindSubmit {
			s.submitRequests.Add(1)
		}
		if err := s.wait(ctx, time.Duration(s.latency.Load())); err != nil {
			return reply{kind: replyAbort, err: err}
		}
		return s.code(req, codeTooBig)
	}
	var ep int
	switch {
	case req.Kind == captchaai.KindSubmit:
		s.submitRequests.Add(1)
		ep = endpointIn
	case path.Base(req.Path) == "res.php":
		ep = endpointRes
		switch req.Kind {
		case captchaai.KindResult:
			s.polls.Add(1)
			s.notePolls(req.ID)
		case captchaai.KindMultiResult:
			s.polls.Add(1)
			s.notePolls(req.IDs...)
		case captchaai.KindReport:
			s.reports.Add(1)
		}
	default:
		return reply{kind: replyWrite, status: http.StatusNotFound,
			header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}}, body: []byte("Not Found")}
	}
	if err := s.wait(ctx, time.Duration(s.latency.Load())); err != nil {
		return reply{kind: replyAbort, err: err}
	}
	if !s.keyOK(req.Key()) {
		return s.code(req, codeWrongUserKey)
	}
	process := s.submit
	if ep == endpointRes {
		process = s.resAction
	}
	d := s.nextFault(ep)
	if d.code != "" {
		return s.code(req, d.code)
	}
	switch d.fault {
	case FaultNoSlot:
		return s.code(req, codeNoSlot)
	case FaultServerError:
		return s.code(req, codeServerError)
	case FaultHTML502:
		return htmlPage(http.StatusBadGateway, html502)
	case FaultReset:
		return reply{kind: replyReset}
	}
	rep := process(req)
	switch d.fault {
	case FaultHTML500:
		return htmlPage(http.StatusInternalServerError, html500)
	case FaultResetAfter:
		return reply{kind: replyReset}
	case FaultTimeout:
		return s.hang(ctx)
	}
	return rep
}

// hang waits until the request is abandoned or the Server closes.
func (s *Server) hang(ctx context.Context) reply {
	select {
	case <-ctx.Done():
		return reply{kind: replyAbort, err: ctx.Err()}
	case <-s.done:
		return reply{kind: replyAbort, err: errClosed}
	}
}

func htmlPage(status int, page string) reply {
	return reply{kind: replyWrite, status: status,
		header: http.Header{"Content-Type": {"text/html; charset=utf-8"}}, body: []byte(page)}
}

// keyOK reports whether key is accepted.
func (s *Server) keyOK(key string) bool {
	if s.cfg.validKeys != nil {
		return s.cfg.validKeys[key]
	}
	return wellFormedKey(key)
}

// wellFormedKey reports whether key is 32 characters of [0-9a-z].
func wellFormedKey(key string) bool {
	if len(key) != 32 {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

func digits(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// notePolls counts a poll request against each named task.
func (s *Server) notePolls(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if t := s.tasks[id]; t != nil {
			t.pollRequests++
		}
	}
}

// ImageAnswer is the default answer to an image: "ANS" and the first 10 hex
// digits of the SHA-256 of its bytes.
func ImageAnswer(image []byte) string {
	sum := sha256.Sum256(image)
	return "ANS" + hex.EncodeToString(sum[:5])
}

// defaultAnswer is the outcome when no Answerer is configured.
func defaultAnswer(t Task) (string, string) {
	if t.Image != nil {
		return ImageAnswer(t.Image), ""
	}
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "TOKEN-" + t.ID + "-" + hex.EncodeToString(b[:]), ""
}

// submit handles in.php after the key and fault checks: validate, create.
func (s *Server) submit(req *captchaai.Request) reply {
	method := req.Method
	var image []byte
	switch {
	case req.Family() == captchaai.FamilyImage, method == "" && len(req.Files) > 0:
		var code string
		image, code = imageOf(req)
		if code != "" {
			return s.code(req, code)
		}
	case method == "":
		return s.code(req, codeBadParameters)
	case method == "userrecaptcha":
		if req.Params.Get("googlekey") == "" {
			return s.code(req, codeWrongGoogle)
		}
		if req.Params.Get("pageurl") == "" {
			return s.code(req, codePageURL)
		}
	case method == "turnstile", method == "hcaptcha":
		if req.Params.Get("sitekey") == "" {
			return s.code(req, codeBadParameters)
		}
	}

	now := time.Now()
	t := &task{Task: Task{
		ID:          s.newID(),
		Key:         req.Key(),
		Method:      method,
		Fingerprint: req.Fingerprint(),
		Params:      cloneValues(req.Params),
		Pingback:    req.Params.Get("pingback"),
		Submitted:   now,
		Image:       image,
	}}
	answerer := s.cfg.answerer
	if answerer == nil {
		answerer = defaultAnswer
	}
	t.Answer, t.Code = answerer(t.snapshot())

	s.mu.Lock()
	if s.cfg.threads > 0 && s.unsolvedLocked(t.Key, now) >= s.cfg.threads {
		s.mu.Unlock()
		return s.code(req, codeNoSlot)
	}
	s.insertLocked(t)
	s.submitsFor[t.Fingerprint]++
	s.submits.Add(1)
	if !s.readyLocked(t, now) && s.cfg.timeBased {
		s.schedulePingbackLocked(t, t.Submitted.Add(s.cfg.solveAfter).Sub(now))
	}
	s.mu.Unlock()

	if req.Format == captchaai.FormatJSON && s.cfg.numericJSON[method] {
		return s.jsonReply(req, 1, []byte(t.ID), false)
	}
	return s.ok(req, t.ID, "OK|")
}

// imageOf returns the decoded image of an image submission, or the error
// code upstream gives for it.
func imageOf(req *captchaai.Request) ([]byte, string) {
	if req.Method == "base64" {
		body := strings.TrimSpace(req.Params.Get("body"))
		if body == "" {
			return nil, codeZeroFilesize
		}
		img, ok := captchaai.DecodeBase64Image(body)
		if !ok {
			return nil, codeUpload
		}
		if len(img) == 0 {
			return nil, codeZeroFilesize
		}
		return img, ""
	}
	var file *captchaai.File
	for i := range req.Files {
		if req.Files[i].Field == "file" {
			file = &req.Files[i]
			break
		}
	}
	if file == nil && len(req.Files) > 0 && req.Method == "" {
		file = &req.Files[0]
	}
	if file == nil || len(file.Data) == 0 {
		return nil, codeZeroFilesize
	}
	return bytes.Clone(file.Data), ""
}

// resAction handles res.php after the key and fault checks.
func (s *Server) resAction(req *captchaai.Request) reply {
	switch req.Kind {
	case captchaai.KindResult:
		return s.get(req)
	case captchaai.KindMultiResult:
		return s.getMany(req)
	case captchaai.KindBalance:
		return s.ok(req, s.cfg.balance, "")
	case captchaai.KindReport:
		s.mu.Lock()
		if t := s.tasks[req.ID]; t != nil && t.Key == req.Key() {
			t.reportCount++
		}
		s.mu.Unlock()
		return reply{kind: replyWrite, status: http.StatusOK, header: s.header(req, ""), body: []byte{}}
	}
	if req.Action == "" {
		return s.code(req, codeEmptyAction)
	}
	return s.code(req, codeBadParameters)
}

// poll processes one poll of id by key: "" and ok for a solution, the code
// otherwise (CAPCHA_NOT_READY included).
func (s *Server) poll(key, id string, now time.Time) (answer string, code string) {
	if !digits(id) {
		return "", codeWrongIDFormat
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tasks[id]
	if t == nil || t.Key != key {
		return "", codeWrongID
	}
	t.Polls++
	if !s.readyLocked(t, now) {
		return "", captchaai.NotReady
	}
	if t.Code != "" {
		return "", t.Code
	}
	return t.Answer, ""
}

func (s *Server) get(req *captchaai.Request) reply {
	answer, code := s.poll(req.Key(), req.ID, time.Now())
	if code != "" {
		return s.code(req, code)
	}
	return s.ok(req, answer, "OK|")
}

// getMany answers ids=a,b,c: one element per id, no "OK|" prefixes.
func (s *Server) getMany(req *captchaai.Request) reply {
	now := time.Now()
	parts := make([]string, len(req.IDs))
	for i, id := range req.IDs {
		answer, code := s.poll(req.Key(), strings.TrimSpace(id), now)
		if code != "" {
			answer = code
		}
		parts[i] = answer
	}
	return s.ok(req, strings.Join(parts, "|"), "")
}

// header returns the answer headers for req in its format ("" content type
// means the format's default).
func (s *Server) header(req *captchaai.Request, ct string) http.Header {
	if ct == "" {
		ct = s.cfg.textCT
		if req.Format == captchaai.FormatJSON {
			ct = s.cfg.jsonCT
		}
	}
	h := http.Header{"Content-Type": {ct}}
	if req.ACAO {
		h.Set("Access-Control-Allow-Origin", "*")
	}
	return h
}

// ok answers a success: prefix+value in plain text ("OK|" for IDs and
// solutions, "" for balances and bulk answers), {"status":1,"request":"…"}
// in JSON.
func (s *Server) ok(req *captchaai.Request, value, prefix string) reply {
	if req.Format == captchaai.FormatJSON {
		return s.jsonReply(req, 1, jsonString(value), false)
	}
	return reply{kind: replyWrite, status: http.StatusOK, header: s.header(req, ""), body: []byte(prefix + value)}
}

// code answers a protocol code (an error, or CAPCHA_NOT_READY).
func (s *Server) code(req *captchaai.Request, code string) reply {
	if req.Format == captchaai.FormatJSON {
		return s.jsonReply(req, 0, jsonString(code), code != captchaai.NotReady && s.cfg.errorText)
	}
	return reply{kind: replyWrite, status: http.StatusOK, header: s.header(req, ""), body: []byte(code)}
}

// jsonReply renders {"status":N,"request":<request>[,"error_text":"…"]}.
func (s *Server) jsonReply(req *captchaai.Request, status int, request []byte, withText bool) reply {
	b := make([]byte, 0, len(request)+40)
	b = append(b, `{"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"request":`...)
	b = append(b, request...)
	if withText {
		var code string
		_ = json.Unmarshal(request, &code) // request is a JSON string made by jsonString
		b = append(b, `,"error_text":`...)
		b = append(b, jsonString(errorText(code))...)
	}
	b = append(b, '}')
	return reply{kind: replyWrite, status: http.StatusOK, header: s.header(req, ""), body: b}
}

// jsonString encodes v as a JSON string without HTML escaping.
func jsonString(v string) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // a string always encodes
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
