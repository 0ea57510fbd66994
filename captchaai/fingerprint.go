package captchaai

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"hash"
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

// volatile parameters change how an answer is delivered, not what is solved.
var volatile = map[string]bool{
	"key": true, "json": true, "header_acao": true, "soft_id": true,
	"pingback": true, "filename": true, "ext": true, "method": true,
}

// defaults are documented parameter defaults, applied so that equivalent
// submissions collide (protocol doc §2.3 step 4).
var defaults = map[Family]map[string]string{
	"userrecaptcha": {"version": "v2", "enterprise": "0", "invisible": "0"},
}

// imageParams hold base64 image data, fingerprinted by decoded bytes.
func imageParam(f Family, name string) bool {
	switch {
	case f == FamilyImage && name == "body":
		return true
	case name == "imginstructions":
		return true
	case strings.HasPrefix(name, "image_base64_"):
		return true
	}
	return false
}

// Fingerprint returns the identity of the task a submission asks for: the
// same API key, method family, task parameters (volatile ones dropped,
// documented defaults applied, empty values ignored) and decoded image
// bytes give the same fingerprint; anything else gives a different one. The
// result starts with the Account and is safe to log and use as a store key.
func (r *Request) Fingerprint() string {
	h := sha256.New()
	fam := r.Family()
	writeField(h, "v1")
	writeField(h, r.key)
	writeField(h, string(fam))

	params := make(map[string][]string, len(r.Params))
	for k, vs := range r.Params {
		if volatile[k] {
			continue
		}
		var keep []string
		for _, v := range vs {
			if v != "" {
				keep = append(keep, v)
			}
		}
		if len(keep) > 0 {
			params[k] = keep
		}
	}
	for k, v := range defaults[fam] {
		if _, ok := params[k]; !ok {
			params[k] = []string{v}
		}
	}
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		vs := params[k]
		if imageParam(fam, k) {
			for _, v := range vs {
				writeField(h, "img:"+imageName(fam, k))
				writeImage(h, []byte(v), true)
			}
			continue
		}
		writeField(h, "p:"+k)
		for _, v := range vs {
			writeField(h, v)
		}
	}
	files := slices.Clone(r.Files)
	slices.SortStableFunc(files, func(a, b File) int { return strings.Compare(a.Field, b.Field) })
	for _, f := range files {
		writeField(h, "img:"+imageName(fam, f.Field))
		writeImage(h, f.Data, false)
	}
	sum := h.Sum(nil)
	return r.Account() + ":" + hex.EncodeToString(sum[:16])
}

// imageName maps the multipart "file" of method=post and the "body" of
// method=base64 to one name, so both encodings of a picture collide.
func imageName(f Family, field string) string {
	if f == FamilyImage && (field == "file" || field == "body") {
		return "image"
	}
	return field
}

// writeImage hashes image bytes: decoded from base64 (data: prefix and
// whitespace removed) when encoded, raw otherwise; undecodable text is
// hashed as text in its own domain so it cannot collide with a picture.
func writeImage(h hash.Hash, data []byte, encoded bool) {
	if encoded {
		if b, ok := DecodeBase64Image(string(data)); ok {
			data = b
		} else {
			writeField(h, "raw")
			writeField(h, string(data))
			return
		}
	}
	sum := sha256.Sum256(data)
	writeField(h, "bytes")
	writeField(h, string(sum[:]))
}

// DecodeBase64Image decodes a base64 image as clients send it: with or
// without a "data:image/…;base64," prefix, padding or line breaks, in the
// standard or URL alphabet. A '+' turned into a space by form decoding is
// restored.
func DecodeBase64Image(s string) ([]byte, bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "data:") {
		i := strings.Index(s, ",")
		if i < 0 {
			return nil, false
		}
		s = s[i+1:]
	}
	s = strings.Map(func(r rune) rune {
		switch r {
		case '\r', '\n', '\t':
			return -1
		case ' ':
			return '+'
		}
		return r
	}, s)
	s = strings.TrimRight(s, "=")
	if s == "" {
		return nil, false
	}
	if b, err := base64.RawStdEncoding.DecodeString(s); err == nil {
		return b, true
	}
	if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
		return b, true
	}
	return nil, false
}

func writeField(h hash.Hash, s string) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
	h.Write([]byte(s))
}
