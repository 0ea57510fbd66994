// Package captchaaitest provides a fake CaptchaAI server for tests and load tests.
//
// The fake speaks the legacy in.php / res.php protocol faithfully (see the
// protocol reference in docs/captchaai-api.md): it accepts every request
// encoding real clients send (GET query, urlencoded POST, multipart with file
// parts, POST with the parameters in the query and an empty body, JSON
// bodies), answers byte for byte (no trailing newline, the misspelled
// CAPCHA_NOT_READY, {"status":0,"request":"CAPCHA_NOT_READY"}), keeps tasks
// per API key, and delivers pingbacks to loopback receivers.
//
// Faults can be injected at run time (FailNext, FailRatio, FailCode,
// SetOutage, SetLatency) with the "was a task created" semantics of the real
// service: ambiguous in.php faults (HTML 500, reset after reading, hang)
// create the task before failing, the others create nothing.
//
// A Server is reachable over real HTTP on a loopback port (Server.URL), and
// in-process through Server.Transport, which needs no network and works
// inside testing/synctest bubbles (use NewInProcess there).
package captchaaitest
