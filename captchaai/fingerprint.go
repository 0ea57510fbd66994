package captchaai

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
)

// Family is a submission's method family: "image" for method=post and
// method=base64 (the same picture may arrive either way), otherwise the
// method exactly as sent. Policies are configured per family.
type Family string

// FamilyImage is the family of normal image captchas.
const FamilyImage Family = "image"

// Family returns the request's method family ("" for requests without a
// method, such as 2captcha text captchas, which are never deduplicated).
func (r *Request) Family() Family {
	switch r.Method {
	case "post", "base64":
		return FamilyImage
	}
	return Family(r.Method)
}

// fingerprintVersion names the canonical encoding below; change it whenever
// the encoding changes so old and new fingerprints can never be equal.
const fingerprintVersion = "v2"

// volatile reports whether a parameter changes how an answer is delivered,
// not what is solved (protocol doc §2.3 step 3). "method" is represented by
// the family instead.
func volatile(name string) bool {
	switch name {
	case "key", "json", "header_acao", "soft_id", "pingback", "filename", "ext", "method":
		return true
	}
	return false
}

// paramDefault is a documented parameter default (protocol doc §2.3 step 4).
type paramDefault struct{ name, value string }

// familyDefaults returns the documented defaults of a family, applied so
// that a request spelling a default out collides with one omitting it.
func familyDefaults(f Family) [3]paramDefault {
	if f == "userrecaptcha" {
		return [3]paramDefault{{"version", "v2"}, {"enterprise", "0"}, {"invisible", "0"}}
	}
	return [3]paramDefault{}
}

// Entry kinds of the canonical encoding.
const (
	kindParam = 'p' // a text parameter: its non-empty values verbatim
	kindImage = 'i' // an image parameter or file part: decoded bytes hashed
	kindMain  = 'm' // the captcha image of method post (file) or base64 (body)
)

// fpEntry is one named item of a fingerprint, before sorting.
type fpEntry struct {
	kind byte
	name string
	vals []string // text values, or base64 images (kindImage/kindMain from params)
	def  string   // the default value of a missing parameter (vals nil)
	file *File    // an uploaded file (vals nil)
}

// isImageParam reports whether a text parameter carries a base64 image,
// fingerprinted by its decoded bytes.
func isImageParam(fam Family, name string) bool {
	return fam == FamilyImage && name == "body" ||
		name == "imginstructions" ||
		strings.HasPrefix(name, "image_base64_")
}

// Fingerprint returns the identity of the task a submission asks for: the
// same API key, method family, task parameters (volatile ones dropped,
// documented defaults applied, empty values ignored) and decoded image
// bytes give the same fingerprint; anything else gives a different one. The
// result starts with the Account and a colon and is safe to log and use as a
// store key.
//
// The captcha image of method=post (the multipart part "file") and of
// method=base64 (the parameter "body", decoded) are the same item, so one
// picture sent either way collides; a "file" part sent with method=base64 or
// a "body" sent with method=post is not that item, as upstream would not
// read it as the image. imginstructions, image_base64_N and every file part
// are hashed by decoded bytes too, a base64 value colliding with a file
// part of the same name and bytes.
func (r *Request) Fingerprint() string {
	fam := r.Family()
	ents := make([]fpEntry, 0, 24)
	for k, vs := range r.Params {
		if volatile(k) || !hasValue(vs) {
			continue
		}
		e := fpEntry{kind: kindParam, name: k, vals: vs}
		if isImageParam(fam, k) {
			e.kind = kindImage
			if k == "body" && r.Method == "base64" {
				e.kind, e.name = kindMain, ""
			}
		}
		ents = append(ents, e)
	}
	for _, d := range familyDefaults(fam) {
		if d.name != "" && !hasValue(r.Params[d.name]) {
			ents = append(ents, fpEntry{kind: kindParam, name: d.name, def: d.value})
		}
	}
	for i := range r.Files {
		f := &r.Files[i]
		e := fpEntry{kind: kindImage, name: f.Field, file: f}
		if f.Field == "file" && r.Method == "post" {
			e.kind, e.name = kindMain, ""
		}
		ents = append(ents, e)
	}
	// Stable: equal (kind, name) pairs only arise from one parameter and
	// several file parts, appended in a fixed order.
	slices.SortStableFunc(ents, func(a, b fpEntry) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), strings.Compare(a.name, b.name))
	})

	var stack [512]byte
	buf := appendField(stack[:0], fingerprintVersion)
	buf = appendField(buf, r.key)
	buf = appendField(buf, string(fam))
	for i := range ents {
		e := &ents[i]
		buf = append(buf, e.kind)
		buf = appendField(buf, e.name)
		switch {
		case e.file != nil:
			buf = binary.AppendUvarint(buf, 1)
			buf = appendDigest(buf, sha256.Sum256(e.file.Data))
		case e.vals == nil:
			buf = binary.AppendUvarint(buf, 1)
			buf = appendField(buf, e.def)
		default:
			buf = binary.AppendUvarint(buf, uint64(countValues(e.vals)))
			for _, v := range e.vals {
				switch {
				case v == "":
				case e.kind == kindParam:
					buf = appendField(buf, v)
				default:
					buf = appendImage(buf, v)
				}
			}
		}
	}
	sum := sha256.Sum256(buf)

	if r.key == "" {
		return AccountOf("") + ":" + hex.EncodeToString(sum[:fingerprintBytes])
	}
	var out [2*accountBytes + 1 + 2*fingerprintBytes]byte
	acc := accountSum(r.key)
	hex.Encode(out[:], acc[:accountBytes])
	out[2*accountBytes] = ':'
	hex.Encode(out[2*accountBytes+1:], sum[:fingerprintBytes])
	return string(out[:])
}

// fingerprintBytes is how much of the SHA-256 a fingerprint keeps.
const fingerprintBytes = 16

// hasValue reports whether any value is non-empty (empty ≡ absent).
func hasValue(vs []string) bool {
	for _, v := range vs {
		if v != "" {
			return true
		}
	}
	return false
}

func countValues(vs []string) int {
	n := 0
	for _, v := range vs {
		if v != "" {
			n++
		}
	}
	return n
}

// appendImage appends the canonical form of a base64 image: the SHA-256 of
// its decoded bytes, or, when it does not decode, the text itself under a
// different tag so that it cannot collide with any picture.
func appendImage(buf []byte, s string) []byte {
	if sum, ok := hashBase64Image(s); ok {
		return appendDigest(buf, sum)
	}
	buf = append(buf, 'r')
	return appendField(buf, s)
}

func appendDigest(buf []byte, sum [sha256.Size]byte) []byte {
	buf = append(buf, 'b')
	return append(buf, sum[:]...)
}

// appendField appends s length-prefixed, so that no two different sequences
// of fields encode alike.
func appendField(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// hashBase64Image returns the SHA-256 of a base64 image decoded as
// DecodeBase64Image does.
func hashBase64Image(s string) ([sha256.Size]byte, bool) {
	var stack [4 << 10]byte
	b, ok := decodeBase64Image(stack[:0], s)
	if !ok {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256(b), true
}

// DecodeBase64Image decodes a base64 image as clients send it: with or
// without a "data:image/…;base64," prefix, padding or line breaks, in the
// standard or URL alphabet (not both at once). A '+' turned into a space by
// form decoding is restored.
func DecodeBase64Image(s string) ([]byte, bool) {
	b, ok := decodeBase64Image(nil, s)
	if !ok {
		return nil, false
	}
	return b, true
}

// b64Table maps a byte to its base64 value (bits 0-5) for either alphabet,
// flagging '+' and '/' (and a space, which stands for a '+' lost to form
// decoding) with b64Std and '-' and '_' with b64URL; CR, LF and tab map to
// b64Skip, '=' to b64Pad, anything else to b64Bad. A constant string, so
// there is no mutable package state.
const b64Table = "" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xc0\xc0\xff\xff\xc0\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\x7e\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7e\xff\xbe\xff\x7f" +
	"\x34\x35\x36\x37\x38\x39\x3a\x3b\x3c\x3d\xff\xff\xff\xc1\xff\xff" +
	"\xff\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e" +
	"\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\xff\xff\xff\xff\xbf" +
	"\xff\x1a\x1b\x1c\x1d\x1e\x1f\x20\x21\x22\x23\x24\x25\x26\x27\x28" +
	"\x29\x2a\x2b\x2c\x2d\x2e\x2f\x30\x31\x32\x33\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff" +
	"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"

// Special values in b64Table; every special value is >= b64Special.
const (
	b64Std     = 0x40
	b64URL     = 0x80
	b64Special = 0xc0
	b64Skip    = 0xc0
	b64Pad     = 0xc1
	b64Bad     = 0xff
)

// decodeBase64Image appends the decoded image to dst in a single pass,
// without copying s. Surrounding white space and a data: prefix are
// removed; CR, LF and tab are skipped anywhere; a space stands for '+';
// trailing '=' padding is optional and nothing but skipped characters may
// follow it; the unused low bits of the last character are ignored, as
// encoding/base64 (and PHP) do.
func decodeBase64Image(dst []byte, s string) ([]byte, bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "data:") {
		i := strings.IndexByte(s, ',')
		if i < 0 {
			return nil, false
		}
		s = s[i+1:]
	}
	if need := len(s)/4*3 + 3; cap(dst)-len(dst) < need {
		dst = append(make([]byte, 0, len(dst)+need), dst...) // one allocation
	}
	var (
		acc    uint32
		n      int  // characters in acc
		total  int  // data characters seen
		flags  byte // b64Std | b64URL seen
		padded bool
	)
	for i := 0; i < len(s); {
		// Fast path: four plain data characters while none are pending.
		if n == 0 && i+4 <= len(s) {
			a, b, c, d := b64Table[s[i]], b64Table[s[i+1]], b64Table[s[i+2]], b64Table[s[i+3]]
			if a < b64Special && b < b64Special && c < b64Special && d < b64Special && !padded {
				flags |= a | b | c | d
				v := uint32(a&0x3f)<<18 | uint32(b&0x3f)<<12 | uint32(c&0x3f)<<6 | uint32(d&0x3f)
				dst = append(dst, byte(v>>16), byte(v>>8), byte(v))
				i += 4
				total += 4
				continue
			}
		}
		v := b64Table[s[i]]
		i++
		switch {
		case v == b64Skip:
			continue
		case v == b64Pad:
			padded = true
			continue
		case v == b64Bad, padded:
			return nil, false // not base64, or data after padding
		}
		flags |= v
		acc = acc<<6 | uint32(v&0x3f)
		n++
		total++
		if n == 4 {
			dst = append(dst, byte(acc>>16), byte(acc>>8), byte(acc))
			acc, n = 0, 0
		}
	}
	if flags&(b64Std|b64URL) == b64Std|b64URL || total == 0 {
		return nil, false // mixed alphabets, or nothing at all
	}
	switch n {
	case 1:
		return nil, false // 6 bits cannot make a byte
	case 2:
		dst = append(dst, byte(acc>>4))
	case 3:
		dst = append(dst, byte(acc>>10), byte(acc>>2))
	}
	return dst, true
}
