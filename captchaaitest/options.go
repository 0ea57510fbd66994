package captchaaitest

import "time"

// Defaults of a Server's configuration.
const (
	// DefaultSolveAfterPolls is the poll on which a task becomes ready unless
	// configured otherwise: the first poll answers CAPCHA_NOT_READY, the
	// second the solution.
	DefaultSolveAfterPolls = 2
	// DefaultBalance is the getbalance answer.
	DefaultBalance = "10.50"
	// DefaultRetain is how many tasks a Server remembers; older ones are
	// forgotten (polling them gives ERROR_WRONG_CAPTCHA_ID, as a task past
	// upstream's retention window does).
	DefaultRetain = 1 << 20
	// DefaultMaxBody bounds request bodies; larger in.php bodies are answered
	// with ERROR_TOO_BIG_CAPTCHA_FILESIZE.
	DefaultMaxBody = 8 << 20
	// PingbackTimeout bounds one pingback delivery.
	PingbackTimeout = 2 * time.Second
)

// config is what Options set. It is fixed once the Server is built; runtime
// knobs (faults, latency, outage) live on the Server.
type config struct {
	solvePolls  int
	solveAfter  time.Duration
	timeBased   bool
	latency     time.Duration
	validKeys   map[string]bool
	threads     int
	numericJSON map[string]bool
	errorText   bool
	answerer    func(Task) (string, string)
	textCT      string
	jsonCT      string
	balance     string
	seed        uint64
	retain      int
	maxBody     int64
}

func defaultConfig() config {
	return config{
		solvePolls: DefaultSolveAfterPolls,
		textCT:     "text/plain; charset=utf-8",
		jsonCT:     "application/json",
		balance:    DefaultBalance,
		seed:       1,
		retain:     DefaultRetain,
		maxBody:    DefaultMaxBody,
	}
}

// Option configures a Server.
type Option func(*config)

// SolveAfterPolls makes a task ready on its n-th poll (default 2: the first
// poll answers CAPCHA_NOT_READY, the second the solution); 0 makes it ready
// at once. It replaces an earlier SolveAfter.
func SolveAfterPolls(n int) Option {
	return func(c *config) {
		c.solvePolls = max(n, 0)
		c.timeBased = false
	}
}

// SolveAfter makes a task ready d after it was submitted, measured with
// time.Now (so it follows fake time inside a testing/synctest bubble when
// the Server is used through Transport). It replaces an earlier
// SolveAfterPolls.
func SolveAfter(d time.Duration) Option {
	return func(c *config) {
		c.solveAfter = max(d, 0)
		c.timeBased = true
	}
}

// Latency delays every answer by d (the wait ends early when the request's
// context is done or the Server closes). SetLatency changes it at run time.
func Latency(d time.Duration) Option {
	return func(c *config) { c.latency = max(d, 0) }
}

// ValidKeys accepts only these API keys; every other key gets
// ERROR_WRONG_USER_KEY on in.php and res.php. By default any 32-character
// [0-9a-z] key is valid.
func ValidKeys(keys ...string) Option {
	return func(c *config) {
		c.validKeys = make(map[string]bool, len(keys))
		for _, k := range keys {
			c.validKeys[k] = true
		}
	}
}

// Threads limits each key to n concurrent unsolved tasks (CaptchaAI's
// "threads"); a submission over the limit is answered
// ERROR_NO_SLOT_AVAILABLE and creates nothing. 0 means unlimited.
func Threads(n int) Option {
	return func(c *config) { c.threads = max(n, 0) }
}

// NumericJSONIDs makes in.php return the task ID as a JSON number, in JSON
// mode, for these methods (CaptchaAI does this for userrecaptcha); other
// methods get a JSON string.
func NumericJSONIDs(methods ...string) Option {
	return func(c *config) {
		if c.numericJSON == nil {
			c.numericJSON = make(map[string]bool, len(methods))
		}
		for _, m := range methods {
			c.numericJSON[m] = true
		}
	}
}

// ErrorText makes JSON error answers carry an "error_text" member after
// "request", as 2captcha does.
func ErrorText(on bool) Option {
	return func(c *config) { c.errorText = on }
}

// Answerer decides the outcome of every task when it is created: answer for
// a solution, or a non-empty code (e.g. ERROR_CAPTCHA_UNSOLVABLE) for a
// terminal error that polls report once the task is ready. f is called
// without the Server's lock held, possibly from several goroutines at once,
// and also for a submission that the Threads limit then refuses.
//
// The default answers image tasks (method post/base64) with "ANS" and the
// first 10 hex digits of the SHA-256 of the decoded image bytes (see
// ImageAnswer), and every other method with a token unique to the task,
// "TOKEN-<taskid>-<16 random hex digits>".
func Answerer(f func(t Task) (answer string, code string)) Option {
	return func(c *config) { c.answerer = f }
}

// ContentTypes sets the Content-Type of plain-text and JSON answers
// (defaults "text/plain; charset=utf-8" and "application/json").
func ContentTypes(text, json string) Option {
	return func(c *config) { c.textCT, c.jsonCT = text, json }
}

// Balance sets the getbalance answer (default "10.50").
func Balance(v string) Option {
	return func(c *config) { c.balance = v }
}

// Seed seeds the pseudo-random generator that FailRatio draws from (default
// 1), so that fault patterns are reproducible.
func Seed(seed uint64) Option {
	return func(c *config) { c.seed = seed }
}

// Retain sets how many tasks the Server remembers (default DefaultRetain);
// the oldest are forgotten first. n <= 0 keeps the default.
func Retain(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.retain = n
		}
	}
}
