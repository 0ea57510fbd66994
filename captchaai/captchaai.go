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

// truthy reports whether a protocol flag value (json, header_acao) is on.
// Upstream is PHP and compares flags loosely with 1 ($v == 1), so a numeric
// string equal to one is on ("1", "01", "1.0", "+1", "1e0", " 1 ") and
// anything else is off: "true", "yes", "2", "0x1", "" and "0". JSON true was
// already turned into "1" by the parser. (Whether upstream really uses == 1
// rather than plain truthiness is unverified, see the protocol doc §9; == 1
// is what its documentation describes: "json=1".)
func truthy(v string) bool {
	if v == "1" {
		return true
	}
	v = strings.Trim(v, " \t\n\r\v\f") // PHP 8 numeric strings allow both
	if !isPHPNumeric(v) {
		return false
	}
	f, err := strconv.ParseFloat(v, 64)
	return err == nil && f == 1
}

// isPHPNumeric reports whether s has the shape of a PHP numeric string:
// [+-] digits [. digits] [e [+-] digits], with digits on at least one side
// of the point. ParseFloat alone would also accept "Inf", "NaN", hex and
// underscores, which PHP does not.
func isPHPNumeric(s string) bool {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, exp = i+1, exp+1
		}
		if exp == 0 {
			return false
		}
	}
	return i == len(s)
}
