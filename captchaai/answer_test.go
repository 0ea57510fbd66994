package captchaai

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// checkGolden compares got with testdata/name.golden (rewritten with -update).
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n got %q\nwant %q", path, got, want)
	}
}

type wantAnswer struct {
	status Status
	value  string
	format Format
	bare   bool
	jv     string // JSONValue; "" means nil
}

func checkAnswer(t *testing.T, body string, a Answer, err error, w wantAnswer) {
	t.Helper()
	if err != nil {
		t.Fatalf("ParseAnswer(%q): %v", body, err)
	}
	if a.Status != w.status || a.Value != w.value || a.Format != w.format || a.Bare != w.bare || string(a.JSONValue) != w.jv {
		t.Errorf("ParseAnswer(%q) = {status %d value %q format %v bare %v json %q}, want {%d %q %v %v %q}",
			body, a.Status, a.Value, a.Format, a.Bare, a.JSONValue, w.status, w.value, w.format, w.bare, w.jv)
	}
	if string(a.Raw) != body {
		t.Errorf("Raw = %q, want the body", a.Raw)
	}
}

func TestParseAnswer(t *testing.T) {
	tests := []struct {
		name string
		body string
		want wantAnswer
	}{
		{"text task id", "OK|73046487691", wantAnswer{StatusOK, "73046487691", FormatText, false, ""}},
		{"text answer with pipes", "OK|a|b||c|", wantAnswer{StatusOK, "a|b||c|", FormatText, false, ""}},
		{"text answer with OK| inside", "OK|OK|x", wantAnswer{StatusOK, "OK|x", FormatText, false, ""}},
		{"text empty answer", "OK|", wantAnswer{StatusOK, "", FormatText, false, ""}},
		{"text answer keeps white space", "OK| x \n", wantAnswer{StatusOK, " x \n", FormatText, false, ""}},
		{"text token", "OK|03AGdBq25SxXT-pmSeBXjzScW-EiocHwwpwqtk1QXlJnGnUJCZrgjwLLdt7cb0", wantAnswer{StatusOK, "03AGdBq25SxXT-pmSeBXjzScW-EiocHwwpwqtk1QXlJnGnUJCZrgjwLLdt7cb0", FormatText, false, ""}},
		{"text GeeTest object", `OK|{"geetest_challenge":"c","geetest_validate":"v"}`, wantAnswer{StatusOK, `{"geetest_challenge":"c","geetest_validate":"v"}`, FormatText, false, ""}},
		{"text not ready", "CAPCHA_NOT_READY", wantAnswer{StatusNotReady, NotReady, FormatText, false, ""}},
		{"text not ready with newline", "CAPCHA_NOT_READY\n", wantAnswer{StatusNotReady, NotReady, FormatText, false, ""}},
		{"text throttle", "ERROR: 1001", wantAnswer{StatusError, "ERROR: 1001", FormatText, false, ""}},
		{"text code with CRLF", "ERROR_ZERO_BALANCE\r\n", wantAnswer{StatusError, "ERROR_ZERO_BALANCE", FormatText, false, ""}},
		{"text unknown code", "ERROR_SOMETHING_NEW", wantAnswer{StatusError, "ERROR_SOMETHING_NEW", FormatText, false, ""}},
		{"text corrected spelling is an unknown code", "CAPTCHA_NOT_READY", wantAnswer{StatusError, "CAPTCHA_NOT_READY", FormatText, false, ""}},
		{"text balance", "1.234", wantAnswer{StatusOK, "1.234", FormatText, true, ""}},
		{"text balance integer", "12", wantAnswer{StatusOK, "12", FormatText, true, ""}},
		{"text balance negative", "-0.5", wantAnswer{StatusOK, "-0.5", FormatText, true, ""}},
		{"text balance PHP exponent", "1.0E-5", wantAnswer{StatusOK, "1.0E-5", FormatText, true, ""}},
		{"text report recorded", "OK_REPORT_RECORDED", wantAnswer{StatusOK, "OK_REPORT_RECORDED", FormatText, true, ""}},
		{"text OK", "OK", wantAnswer{StatusOK, "OK", FormatText, true, ""}},
		{"empty body (report)", "", wantAnswer{StatusEmpty, "", FormatText, false, ""}},
		{"white space body", " \r\n", wantAnswer{StatusEmpty, "", FormatText, false, ""}},
		{"json string id", `{"status":1,"request":"73046487691"}`, wantAnswer{StatusOK, "73046487691", FormatJSON, false, `"73046487691"`}},
		{"json numeric id", `{"status":1,"request":73046487691}`, wantAnswer{StatusOK, "73046487691", FormatJSON, false, `73046487691`}},
		{"json status as string", `{"status":"1","request":"tok"}`, wantAnswer{StatusOK, "tok", FormatJSON, false, `"tok"`}},
		{"json GeeTest object", `{"status":1,"request":{"geetest_challenge": "c", "geetest_validate":"v"}}`,
			wantAnswer{StatusOK, `{"geetest_challenge":"c","geetest_validate":"v"}`, FormatJSON, false, `{"geetest_challenge": "c", "geetest_validate":"v"}`}},
		{"json BLS array in a string", `{"status":1,"request":"[1,4,7,8]"}`, wantAnswer{StatusOK, "[1,4,7,8]", FormatJSON, false, `"[1,4,7,8]"`}},
		{"json extra fields", `{"status":1,"request":"tok","useragent":"Mozilla/5.0","respKey":"E0_x"}`, wantAnswer{StatusOK, "tok", FormatJSON, false, `"tok"`}},
		{"json escaped string", `{"status":1,"request":"a\/b\u00e9|c"}`, wantAnswer{StatusOK, "a/b\u00e9|c", FormatJSON, false, `"a\/b\u00e9|c"`}},
		{"json no request", `{"status":1}`, wantAnswer{StatusOK, "", FormatJSON, false, ""}},
		{"json null request", `{"status":1,"request":null}`, wantAnswer{StatusOK, "", FormatJSON, false, "null"}},
		{"json not ready", `{"status":0,"request":"CAPCHA_NOT_READY"}`, wantAnswer{StatusNotReady, NotReady, FormatJSON, false, `"CAPCHA_NOT_READY"`}},
		{"json error with error_text", `{"status":0,"request":"ERROR_WRONG_USER_KEY","error_text":"You've provided key parameter value in incorrect format"}`,
			wantAnswer{StatusError, "ERROR_WRONG_USER_KEY", FormatJSON, false, `"ERROR_WRONG_USER_KEY"`}},
		{"json throttle", `{"status":0,"request":"ERROR: 1005"}`, wantAnswer{StatusError, "ERROR: 1005", FormatJSON, false, `"ERROR: 1005"`}},
		{"json status 0 as string", `{"status":"0","request":"IP_BANNED"}`, wantAnswer{StatusError, "IP_BANNED", FormatJSON, false, `"IP_BANNED"`}},
		{"json pretty", "{\n  \"status\": 1,\n  \"request\": \"x\"\n}\n", wantAnswer{StatusOK, "x", FormatJSON, false, `"x"`}},
		{"json repeated member last wins", `{"status":0,"request":"x","status":1}`, wantAnswer{StatusOK, "x", FormatJSON, false, `"x"`}},
		{"json report recorded", `{"status":1,"request":"OK_REPORT_RECORDED"}`, wantAnswer{StatusOK, "OK_REPORT_RECORDED", FormatJSON, false, `"OK_REPORT_RECORDED"`}},
		{"json balance", `{"status":1,"request":"1.234"}`, wantAnswer{StatusOK, "1.234", FormatJSON, false, `"1.234"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseAnswer([]byte(tc.body))
			checkAnswer(t, tc.body, a, err, tc.want)
		})
	}
}

func TestParseAnswerEveryCode(t *testing.T) {
	for _, code := range Codes() {
		t.Run(code, func(t *testing.T) {
			a, err := ParseAnswer([]byte(code))
			checkAnswer(t, code, a, err, wantAnswer{StatusError, code, FormatText, false, ""})
			for _, body := range []string{
				`{"status":0,"request":"` + code + `"}`,
				`{"status":0,"request":"` + code + `","error_text":"text"}`,
			} {
				a, err := ParseAnswer([]byte(body))
				checkAnswer(t, body, a, err, wantAnswer{StatusError, code, FormatJSON, false, `"` + code + `"`})
				if got := a.Render(FormatText); string(got) != code {
					t.Errorf("Render(text) = %q, want %q", got, code)
				}
			}
			if got := Text(code).Render(FormatJSON); string(got) != `{"status":0,"request":"`+code+`"}` {
				t.Errorf("Text(code).Render(json) = %q", got)
			}
		})
	}
}

func TestParseAnswerNotProtocol(t *testing.T) {
	for name, body := range map[string]string{
		"HTML 500":                   "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
		"HTML 502":                   "<!DOCTYPE html><html><body>Bad Gateway</body></html>",
		"plain text error":           "Bad Gateway",
		"garbage":                    "\x00\xff\xfe",
		"lower-case ok":              "ok|123",
		"OK without bar":             "OK123",
		"OK space":                   "OK 123",
		"code with lower case":       "ERROR_wrong",
		"code starting with a digit": "1ERROR",
		"throttle without number":    "ERROR: ",
		"throttle with sign":         "ERROR: +5",
		"two letters":                "AB",
		"bulk answer":                "ans1|CAPCHA_NOT_READY|ans3",
		"Inf":                        "Inf",
		"NaN":                        "NaN",
		"hex":                        "0x1p3",
		"plus number":                "+1",
		"json truncated":             `{"status":1,"request":"x"`,
		"json trailing data":         `{"status":1,"request":"x"} x`,
		"json without status":        `{"request":"x"}`,
		"json other object":          `{"error":"not found"}`,
		"json upper-case members":    `{"Status":1,"Request":"x"}`,
		"json status 0 free text":    `{"status":0,"request":"something went wrong"}`,
		"json status 0 number":       `{"status":0,"request":5}`,
		"json status 0 no request":   `{"status":0}`,
		"json status 0 OK word":      `{"status":0,"request":"OK_REPORT_RECORDED"}`,
		"json status 2":              `{"status":2,"request":"x"}`,
		"json status true":           `{"status":true,"request":"x"}`,
		"json array":                 `[{"status":1}]`,
		"json string":                `"OK|1"`,
	} {
		t.Run(name, func(t *testing.T) {
			a, err := ParseAnswer([]byte(body))
			if !errors.Is(err, ErrNotProtocol) {
				t.Errorf("ParseAnswer(%q) = %+v, %v; want ErrNotProtocol", body, a, err)
			}
		})
	}
}

func TestRenderSameFormatIsRaw(t *testing.T) {
	for _, body := range []string{
		"OK|73046487691",
		"OK|a|b",
		"CAPCHA_NOT_READY",
		"ERROR_CAPTCHA_UNSOLVABLE",
		"CAPCHA_NOT_READY\n",
		"1.234",
		"",
		`{"status":1,"request":73046487691}`,
		`{"status":1,"request":"tok","useragent":"Mozilla/5.0","respKey":"E0"}`,
		`{"status":0,"request":"ERROR_WRONG_USER_KEY","error_text":"bad key"}`,
		`{"status":1,"request":{"geetest_challenge": "c"}}`,
		"{ \"status\" : \"1\" , \"request\" : \"a\\/b\" }",
	} {
		a, err := ParseAnswer([]byte(body))
		if err != nil {
			t.Fatalf("ParseAnswer(%q): %v", body, err)
		}
		if got := a.Render(a.Format); string(got) != body {
			t.Errorf("Render(%v) of %q = %q", a.Format, body, got)
		}
	}
}

// TestRenderCrossFormat renders upstream answers in the other format and
// compares with testdata/*.golden (go test -update rewrites them).
func TestRenderCrossFormat(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string // also checked inline, so a bad -update cannot hide a change
	}{
		{"text_ok_id_to_json", "OK|73046487691", `{"status":1,"request":"73046487691"}`},
		{"text_ok_pipes_to_json", "OK|a|b|c", `{"status":1,"request":"a|b|c"}`},
		{"text_ok_special_to_json", "OK|<a&b> \"q\" \\ é\t", `{"status":1,"request":"<a&b> \"q\" \\ é\t"}`},
		{"text_ok_geetest_to_json", `OK|{"geetest_challenge":"c"}`, `{"status":1,"request":"{\"geetest_challenge\":\"c\"}"}`},
		{"text_not_ready_to_json", "CAPCHA_NOT_READY", `{"status":0,"request":"CAPCHA_NOT_READY"}`},
		{"text_error_to_json", "ERROR_CAPTCHA_UNSOLVABLE", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
		{"text_throttle_to_json", "ERROR: 1001", `{"status":0,"request":"ERROR: 1001"}`},
		{"text_balance_to_json", "1.234", `{"status":1,"request":"1.234"}`},
		{"text_report_recorded_to_json", "OK_REPORT_RECORDED", `{"status":1,"request":"OK_REPORT_RECORDED"}`},
		{"text_empty_to_json", "", ``},
		{"json_string_id_to_text", `{"status":1,"request":"73046487691"}`, "OK|73046487691"},
		{"json_numeric_id_to_text", `{"status":1,"request":73046487691}`, "OK|73046487691"},
		{"json_status_string_to_text", `{"status":"1","request":"tok"}`, "OK|tok"},
		{"json_extra_fields_to_text", `{"status":1,"request":"tok","useragent":"UA"}`, "OK|tok"},
		{"json_geetest_object_to_text", `{"status":1,"request":{"geetest_challenge": "c", "geetest_seccode": "s|jordan"}}`,
			`OK|{"geetest_challenge":"c","geetest_seccode":"s|jordan"}`},
		{"json_not_ready_to_text", `{"status":0,"request":"CAPCHA_NOT_READY"}`, "CAPCHA_NOT_READY"},
		{"json_error_text_to_text", `{"status":0,"request":"ERROR_ZERO_BALANCE","error_text":"no threads"}`, "ERROR_ZERO_BALANCE"},
		{"json_escaped_to_text", `{"status":1,"request":"a\/b\u00e9"}`, "OK|a/bé"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseAnswer([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			other := FormatJSON
			if a.Format == FormatJSON {
				other = FormatText
			}
			got := a.Render(other)
			if string(got) != tc.want {
				t.Errorf("Render(%v) of %q = %q, want %q", other, tc.body, got, tc.want)
			}
			if bytes.HasSuffix(got, []byte("\n")) {
				t.Error("trailing newline")
			}
			checkGolden(t, tc.name, got)
			back, err := ParseAnswer(got)
			if err != nil || back.Status != a.Status || back.Value != a.Value {
				t.Errorf("re-parse of %q = %v %q, %v; want %v %q", got, back.Status, back.Value, err, a.Status, a.Value)
			}
		})
	}
}

func TestRenderSynthesised(t *testing.T) {
	tests := []struct {
		name       string
		a          Answer
		text, json string
	}{
		{"not ready", Text(NotReady), "CAPCHA_NOT_READY", `{"status":0,"request":"CAPCHA_NOT_READY"}`},
		{"no slot", Text(CodeNoSlot), "ERROR_NO_SLOT_AVAILABLE", `{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE"}`},
		{"unsolvable", Text(CodeUnsolvable), "ERROR_CAPTCHA_UNSOLVABLE", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
		{"ok id", OK("123456789"), "OK|123456789", `{"status":1,"request":"123456789"}`},
		{"ok numeric id", Answer{Status: StatusOK, Value: "123456789", JSONValue: []byte("123456789")},
			"OK|123456789", `{"status":1,"request":123456789}`},
		{"ok html characters", OK("<&>"), "OK|<&>", `{"status":1,"request":"<&>"}`},
		{"empty", Answer{Status: StatusEmpty}, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.a.Render(FormatText); string(got) != tc.text {
				t.Errorf("text = %q, want %q", got, tc.text)
			}
			if got := tc.a.Render(FormatJSON); string(got) != tc.json {
				t.Errorf("json = %q, want %q", got, tc.json)
			}
		})
	}
	if a := Text(NotReady); a.Status != StatusNotReady || a.Terminal() {
		t.Errorf("Text(NotReady) = %+v", a)
	}
}

func TestTerminal(t *testing.T) {
	tests := []struct {
		body string
		want bool
	}{
		{"OK|token", true},
		{"OK|73046487691", true},
		{"CAPCHA_NOT_READY", false},
		{"", false},
		{"ERROR_CAPTCHA_UNSOLVABLE", true},
		{"ERROR_WRONG_CAPTCHA_ID", true},
		{"ERROR_BAD_DUPLICATES", true},
		{"ERROR_TOKEN_EXPIRED", true},
		{"ERROR_PROXY_CONNECTION_FAILED", true},
		{"ERROR_NO_SLOT_AVAILABLE", false},
		{"ERROR_SERVER_ERROR", false},
		{"ERROR_WRONG_USER_KEY", false},
		{"IP_BANNED", false},
		{"ERROR: 1005", false},
		{"ERROR_SOMETHING_NEW", false},
		{`{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`, true},
		{`{"status":0,"request":"CAPCHA_NOT_READY"}`, false},
		{`{"status":1,"request":"x"}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.body, func(t *testing.T) {
			a, err := ParseAnswer([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := a.Terminal(); got != tc.want {
				t.Errorf("Terminal() = %v, want %v", got, tc.want)
			}
		})
	}
	if (Answer{Status: StatusRaw}).Terminal() {
		t.Error("StatusRaw is terminal")
	}
}

// docCodes is every code of the protocol doc's §5.1 and §5.2 tables with
// its class and announced pause.
var docCodes = map[string]struct {
	class Class
	pause time.Duration
}{
	// §5.1 in.php
	"ERROR_WRONG_USER_KEY":           {ClassAccount, 0},
	"ERROR_KEY_DOES_NOT_EXIST":       {ClassAccount, 0},
	"ERROR_ZERO_BALANCE":             {ClassCapacity, 0}, // CaptchaAI: no free thread right now
	"ERROR_NO_SLOT_AVAILABLE":        {ClassCapacity, 0},
	"ERROR_PAGEURL":                  {ClassRequest, 0},
	"ERROR_GOOGLEKEY":                {ClassRequest, 0},
	"ERROR_WRONG_GOOGLEKEY":          {ClassRequest, 0},
	"ERROR_BAD_TOKEN_OR_PAGEURL":     {ClassRequest, 0},
	"ERROR_BAD_PARAMETERS":           {ClassRequest, 0},
	"ERROR_ZERO_CAPTCHA_FILESIZE":    {ClassRequest, 0},
	"ERROR_TOO_BIG_CAPTCHA_FILESIZE": {ClassRequest, 0},
	"ERROR_WRONG_FILE_EXTENSION":     {ClassRequest, 0},
	"ERROR_IMAGE_TYPE_NOT_SUPPORTED": {ClassRequest, 0},
	"ERROR_UPLOAD":                   {ClassRequest, 0},
	"ERROR_CAPTCHAIMAGE_BLOCKED":     {ClassRequest, 0},
	"TOO_MANY_BAD_IMAGES":            {ClassThrottle, time.Minute},
	"ERROR_IP_NOT_ALLOWED":           {ClassAccount, 0},
	"IP_BANNED":                      {ClassBanned, 5 * time.Minute},
	"ERROR_IP_BANNED":                {ClassBanned, 5 * time.Minute},
	"ERROR_BAD_PROXY":                {ClassRequest, 0},
	"ERROR_CAPTCHA_ID":               {ClassRequest, 0},
	"ERROR_NO_SUCH_METHOD":           {ClassRequest, 0},
	"ERROR_SERVER_ERROR":             {ClassServer, 0},
	"ERROR_INTERNAL_SERVER_ERROR":    {ClassServer, 0},
	"MAX_USER_TURN":                  {ClassThrottle, 10 * time.Second},
	"ERROR: 1001":                    {ClassThrottle, 10 * time.Minute},
	"ERROR: 1002":                    {ClassThrottle, 5 * time.Minute},
	"ERROR: 1003":                    {ClassThrottle, 30 * time.Second},
	"ERROR: 1004":                    {ClassBanned, 10 * time.Minute},
	"ERROR_TOO_MUCH_REQUESTS":        {ClassCapacity, 0},
	// §5.2 res.php
	"ERROR_CAPTCHA_UNSOLVABLE":      {ClassTerminal, 0},
	"ERROR_WRONG_ID_FORMAT":         {ClassRequest, 0},
	"ERROR_WRONG_CAPTCHA_ID":        {ClassTerminal, 0},
	"ERROR_BAD_DUPLICATES":          {ClassTerminal, 0},
	"ERROR_TOKEN_EXPIRED":           {ClassTerminal, 0},
	"ERROR_PROXY_CONNECTION_FAILED": {ClassTerminal, 0},
	"ERROR_EMPTY_ACTION":            {ClassRequest, 0},
	"ERROR_REPORT_NOT_RECORDED":     {ClassRequest, 0},
	"REPORT_NOT_RECORDED":           {ClassRequest, 0},
	"ERROR_DUPLICATE_REPORT":        {ClassRequest, 0},
	"ERROR_IP_ADDRES":               {ClassRequest, 0},
	"ERROR: 1005":                   {ClassThrottle, 5 * time.Minute},
}

func TestClassifyAndPause(t *testing.T) {
	for code, want := range docCodes {
		t.Run(code, func(t *testing.T) {
			if got := Classify(code); got != want.class {
				t.Errorf("Classify = %v, want %v", got, want.class)
			}
			if got := Pause(code); got != want.pause {
				t.Errorf("Pause = %v, want %v", got, want.pause)
			}
			if (want.class == ClassThrottle || want.class == ClassBanned) != (want.pause > 0) {
				t.Errorf("class %v with pause %v", want.class, want.pause)
			}
		})
	}
	codes := Codes()
	if !slices.IsSorted(codes) {
		t.Error("Codes() not sorted")
	}
	for _, c := range codes {
		if _, ok := docCodes[c]; !ok {
			t.Errorf("Codes() has %q, which the protocol doc does not list", c)
		}
	}
	if len(codes) != len(docCodes) {
		t.Errorf("Codes() has %d codes, doc %d", len(codes), len(docCodes))
	}
	for _, c := range []string{NotReady, "", "ERROR_SOMETHING_NEW", "error_wrong_user_key", "OK_REPORT_RECORDED"} {
		if got := Classify(c); got != ClassUnknown || Pause(c) != 0 {
			t.Errorf("Classify(%q) = %v, Pause %v; want unknown, 0", c, got, Pause(c))
		}
	}
	for code, want := range map[string]Class{CodeNoSlot: ClassCapacity, CodeUnsolvable: ClassTerminal,
		CodeTooBig: ClassRequest, CodeBadParameters: ClassRequest} {
		if got := Classify(code); got != want {
			t.Errorf("Classify(%s) = %v, want %v", code, got, want)
		}
	}
	names := map[Class]string{ClassUnknown: "unknown", ClassRequest: "request", ClassAccount: "account",
		ClassBanned: "banned", ClassCapacity: "capacity", ClassThrottle: "throttle", ClassServer: "server",
		ClassTerminal: "terminal", Class(200): "unknown"}
	for c, want := range names {
		if c.String() != want {
			t.Errorf("Class(%d).String() = %q, want %q", c, c.String(), want)
		}
	}
}
