package captchaai

import (
	"maps"
	"slices"
	"time"
)

// Class is what an error code means for whoever handles it.
type Class uint8

const (
	// ClassUnknown: a code not in the table. Treat as permanent: never
	// retried, never a reason to trip the circuit.
	ClassUnknown Class = iota
	// ClassRequest: the request is wrong; the caller must fix it.
	ClassRequest
	// ClassAccount: the API key is wrong or not allowed. Never retried;
	// remembered per key so a bad key cannot get the shared IP banned.
	ClassAccount
	// ClassBanned: the caller's IP is banned (after bad keys). Remembered per
	// key like ClassAccount, for at least the announced pause.
	ClassBanned
	// ClassCapacity: not accepted now, nothing was created; retry later.
	ClassCapacity
	// ClassThrottle: not accepted, and upstream announced a pause (Pause).
	ClassThrottle
	// ClassServer: upstream fault. On in.php the task may or may not exist
	// (ambiguous); on res.php the task still exists (transient).
	ClassServer
	// ClassTerminal: the task is over and will never be solved.
	ClassTerminal
)

var classNames = [...]string{"unknown", "request", "account", "banned", "capacity", "throttle", "server", "terminal"}

// String returns a short name, suitable as a metric label.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "unknown"
}

type codeInfo struct {
	class Class
	pause time.Duration
}

// codes is the one table of CaptchaAI/2captcha error codes (protocol doc §5).
var codes = map[string]codeInfo{
	// in.php
	"ERROR_WRONG_USER_KEY":           {ClassAccount, 0},
	"ERROR_KEY_DOES_NOT_EXIST":       {ClassAccount, 0},
	"ERROR_IP_NOT_ALLOWED":           {ClassAccount, 0},
	"ERROR_ZERO_BALANCE":             {ClassCapacity, 0},
	"ERROR_NO_SLOT_AVAILABLE":        {ClassCapacity, 0},
	"ERROR_TOO_MUCH_REQUESTS":        {ClassCapacity, 0},
	"TOO_MANY_BAD_IMAGES":            {ClassThrottle, time.Minute},
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
	"ERROR_BAD_PROXY":                {ClassRequest, 0},
	"ERROR_CAPTCHA_ID":               {ClassRequest, 0},
	"ERROR_NO_SUCH_METHOD":           {ClassRequest, 0},
	"IP_BANNED":                      {ClassBanned, 5 * time.Minute},
	"ERROR_IP_BANNED":                {ClassBanned, 5 * time.Minute},
	"ERROR_SERVER_ERROR":             {ClassServer, 0},
	"ERROR_INTERNAL_SERVER_ERROR":    {ClassServer, 0},
	"MAX_USER_TURN":                  {ClassThrottle, 10 * time.Second},
	"ERROR: 1001":                    {ClassThrottle, 10 * time.Minute},
	"ERROR: 1002":                    {ClassThrottle, 5 * time.Minute},
	"ERROR: 1003":                    {ClassThrottle, 30 * time.Second},
	"ERROR: 1004":                    {ClassBanned, 10 * time.Minute},
	"ERROR: 1005":                    {ClassThrottle, 5 * time.Minute},
	// res.php
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
}

// Classify returns the class of an error code; ClassUnknown for anything
// not in the table (including CAPCHA_NOT_READY, which is not an error).
func Classify(code string) Class { return codes[code].class }

// Pause returns how long upstream announced it will refuse requests after
// code (throttle and ban codes), or 0.
func Pause(code string) time.Duration { return codes[code].pause }

// Codes returns every code in the table, sorted, for tests and
// documentation. CAPCHA_NOT_READY is not an error and not in the table.
func Codes() []string {
	return slices.Sorted(maps.Keys(codes))
}

// Codes solveonce itself answers with.
const (
	// CodeNoSlot is the documented "retry later" answer of in.php, used when
	// solveonce fails fast for upstream's sake.
	CodeNoSlot = "ERROR_NO_SLOT_AVAILABLE"
	// CodeUnsolvable ends a task solveonce knows is dead.
	CodeUnsolvable = "ERROR_CAPTCHA_UNSOLVABLE"
	// CodeTooBig answers an in.php body over the size limit.
	CodeTooBig = "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
	// CodeBadParameters answers other malformed requests.
	CodeBadParameters = "ERROR_BAD_PARAMETERS"
)
