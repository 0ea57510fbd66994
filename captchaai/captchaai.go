// Package captchaai reads and writes the CaptchaAI legacy wire protocol
// (in.php / res.php, the 2captcha "API v1" clone): it parses every request
// encoding real clients send, fingerprints submissions, parses and renders
// answers byte for byte, and classifies error codes.
//
// It is pure: no I/O beyond reading a request body, no globals that change,
// only the standard library. Every other solveonce package builds on it.
package captchaai

import (
	"strconv"
	"strings"
)

// Kind says what a request asks CaptchaAI to do.
type Kind uint8

const (
	// KindOther is anything solveonce does not understand; it is forwarded
	// unchanged and never deduplicated or cached.
	KindOther Kind = iota
	// KindSubmit is an in.php submission.
	KindSubmit
	// KindResult is res.php?action=get with one id.
	KindResult
	// KindMultiResult is res.php?action=get with ids=a,b,c.
	KindMultiResult
	// KindBalance is res.php?action=getbalance.
	KindBalance
	// KindReport is res.php?action=reportbad or reportgood.
	KindReport
)

var kindNames = [...]string{"other", "submit", "result", "multiresult", "balance", "report"}

// String returns a short lower-case name, suitable as a metric label.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Endpoint returns "in.php" for submissions and "res.php" for every res.php
// action; "other" for anything else. It is a safe metric label.
func (k Kind) Endpoint() string {
	switch k {
	case KindSubmit:
		return "in.php"
	case KindOther:
		return "other"
	default:
		return "res.php"
	}
}

// Format is the response format a client asked for.
type Format uint8

const (
	// FormatText is the plain format: "OK|…", bare codes, CAPCHA_NOT_READY.
	FormatText Format = iota
	// FormatJSON is json=1: {"status":…,"request":…}.
	FormatJSON
)

// String returns "text" or "json".
func (f Format) String() string {
	if f == FormatJSON {
		return "json"
	}
	return "text"
}

// truthy reports whether a protocol flag value is on. Upstream is PHP and
// compares flags loosely with 1, so "1", "01" and "1.0" are on and "true"
// is not; JSON true was already turned into "1" by the parser.
func truthy(v string) bool {
	v = strings.TrimSpace(v)
	if v == "" {
		return false
	}
	if v == "1" {
		return true
	}
	f, err := strconv.ParseFloat(v, 64)
	return err == nil && f != 0
}
