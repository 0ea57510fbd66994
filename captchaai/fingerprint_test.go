package captchaai

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
)

// imageWithPlus returns a fake image whose standard base64 contains '+'
// and '/', so that form decoding and alphabet handling are exercised.
func imageWithPlus(t testing.TB, n int) []byte {
	t.Helper()
	for seed := uint64(1); seed < 1000; seed++ {
		img := fakeImage(n, seed)
		if s := b64(img); strings.Contains(s, "+") && strings.Contains(s, "/") && len(img)%3 != 0 {
			return img
		}
	}
	t.Fatal("no image with '+' in its base64")
	return nil
}

// multipartFile is a method=post submission of img with extra text fields.
func multipartFile(t testing.TB, key string, img []byte, fields ...string) *Request {
	t.Helper()
	parts := []part{{Name: "key", Value: key}, {Name: "method", Value: "post"}}
	for i := 0; i+1 < len(fields); i += 2 {
		parts = append(parts, part{Name: fields[i], Value: fields[i+1]})
	}
	parts = append(parts, part{Name: "file", File: true, Filename: "captcha.png", Type: "image/png", Value: string(img)})
	body, ct := multipartBody(t, parts...)
	r := Parse(http.MethodPost, "/in.php", "", hdr(ct), body)
	if !r.Understood {
		t.Fatal("multipart fixture not understood")
	}
	return r
}

// wrapLines breaks s every n characters with sep, as MIME encoders do.
func wrapLines(s string, n int, sep string) string {
	var b strings.Builder
	for len(s) > n {
		b.WriteString(s[:n])
		b.WriteString(sep)
		s = s[n:]
	}
	b.WriteString(s)
	return b.String()
}

func TestFingerprintImageEncodingsCollide(t *testing.T) {
	img := imageWithPlus(t, 2000)
	enc := b64(img)
	// Every request below asks for the same image with numeric=1 and
	// phrase=0: parameters sorting both before and after "body".
	ref := multipartFile(t, testKey, img, "numeric", "1", "calc", "0", "soft_id", "4585")
	want := ref.Fingerprint()

	rawPlusBody := "key=" + testKey + "&method=base64&numeric=1&calc=0&body=" + enc // '+' not escaped
	mpBase64, mpType := multipartBody(t,
		part{Name: "key", Value: testKey}, part{Name: "method", Value: "base64"},
		part{Name: "body", Value: enc}, part{Name: "numeric", Value: "1"}, part{Name: "calc", Value: "0"})
	tests := []struct {
		name string
		req  *Request
	}{
		{"multipart file again, other filename", multipartFile(t, testKey, img, "calc", "0", "numeric", "1", "json", "1")},
		{"base64 form", postForm("key", testKey, "method", "base64", "body", enc, "numeric", "1", "calc", "0")},
		{"base64 form, params reordered", postForm("calc", "0", "body", enc, "numeric", "1", "method", "base64", "key", testKey)},
		{"base64 data URI prefix", postForm("key", testKey, "method", "base64", "body", "data:image/png;base64,"+enc, "numeric", "1", "calc", "0")},
		{"base64 CRLF line breaks", postForm("key", testKey, "method", "base64", "body", wrapLines(enc, 76, "\r\n"), "numeric", "1", "calc", "0")},
		{"base64 LF line breaks and trailing newline", postForm("key", testKey, "method", "base64", "body", wrapLines(enc, 64, "\n")+"\n", "numeric", "1", "calc", "0")},
		{"base64 missing padding", postForm("key", testKey, "method", "base64", "body", strings.TrimRight(enc, "="), "numeric", "1", "calc", "0")},
		{"base64 URL alphabet", postForm("key", testKey, "method", "base64", "body", base64.RawURLEncoding.EncodeToString(img), "numeric", "1", "calc", "0")},
		{"base64 '+' turned into ' ' by form decoding", Parse(http.MethodPost, "/in.php", "", hdr(formType), []byte(rawPlusBody))},
		{"base64 in query", getQuery("/in.php", "key", testKey, "method", "base64", "body", enc, "numeric", "1", "calc", "0")},
		{"base64 JSON body with numbers", Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
			[]byte(`{"key":"`+testKey+`","method":"base64","body":"`+enc+`","numeric":1,"calc":0,"json":1,"soft_id":4584,"filename":"c.png","ext":"png"}`))},
		{"base64 multipart text part", Parse(http.MethodPost, "/in.php", "", hdr(mpType), mpBase64)},
	}
	if !strings.Contains(rawPlusBody, "+") {
		t.Fatal("fixture has no '+'")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.req.Understood {
				t.Fatal("not understood")
			}
			if got := tc.req.Fingerprint(); got != want {
				t.Errorf("Fingerprint = %s, want %s (the multipart file)", got, want)
			}
		})
	}
}

func TestFingerprintDiffers(t *testing.T) {
	img := fakeImage(1500, 3)
	other := bytes.Clone(img)
	other[len(other)-1] ^= 1
	enc := b64(img)
	rc := []string{"key", testKey, "method", "userrecaptcha", "googlekey", siteKey, "pageurl", pageURL}
	with := func(kv ...string) *Request { return getQuery("/in.php", append(append([]string{}, rc...), kv...)...) }

	tests := []struct {
		name string
		a, b *Request
	}{
		{"same captcha, two keys", getQuery("/in.php", "key", testKey, "method", "turnstile", "sitekey", "0x4", "pageurl", pageURL),
			getQuery("/in.php", "key", otherKey, "method", "turnstile", "sitekey", "0x4", "pageurl", pageURL)},
		{"same image, two keys", multipartFile(t, testKey, img), multipartFile(t, otherKey, img)},
		{"key vs no key", multipartFile(t, testKey, img), multipartFile(t, "", img)},
		{"different images multipart", multipartFile(t, testKey, img), multipartFile(t, testKey, other)},
		{"different images base64", postForm("key", testKey, "method", "base64", "body", enc),
			postForm("key", testKey, "method", "base64", "body", b64(other))},
		{"different images file vs base64", multipartFile(t, testKey, img),
			postForm("key", testKey, "method", "base64", "body", b64(other))},
		{"image parameter differs", multipartFile(t, testKey, img, "numeric", "1"), multipartFile(t, testKey, img, "numeric", "2")},
		{"image parameter added", multipartFile(t, testKey, img), multipartFile(t, testKey, img, "regsense", "1")},
		{"pageurl trailing slash", with(), getQuery("/in.php", "key", testKey, "method", "userrecaptcha", "googlekey", siteKey, "pageurl", pageURL+"/")},
		{"pageurl case", getQuery("/in.php", "method", "turnstile", "pageurl", "https://example.com/A"),
			getQuery("/in.php", "method", "turnstile", "pageurl", "https://example.com/a")},
		{"pageurl scheme", getQuery("/in.php", "method", "turnstile", "pageurl", "https://example.com/"),
			getQuery("/in.php", "method", "turnstile", "pageurl", "http://example.com/")},
		{"version v3 vs default", with(), with("version", "v3")},
		{"enterprise 1 vs default", with(), with("enterprise", "1")},
		{"invisible 1 vs default", with(), with("invisible", "1")},
		{"v3 action", with("version", "v3", "action", "verify"), with("version", "v3", "action", "login")},
		{"userAgent", with("userAgent", "A"), with("userAgent", "B")},
		{"userAgent vs useragent", with("userAgent", "A"), with("useragent", "A")},
		{"proxy", with("proxy", "u:p@1.2.3.4:8080", "proxytype", "HTTP"), with("proxy", "u:p@1.2.3.5:8080", "proxytype", "HTTP")},
		{"defaults only for userrecaptcha", getQuery("/in.php", "method", "turnstile", "sitekey", "s"),
			getQuery("/in.php", "method", "turnstile", "sitekey", "s", "version", "v2")},
		{"method is identifying", getQuery("/in.php", "method", "turnstile", "sitekey", "s", "pageurl", pageURL),
			getQuery("/in.php", "method", "hcaptcha", "sitekey", "s", "pageurl", pageURL)},
		{"method case as sent", getQuery("/in.php", "method", "turnstile", "sitekey", "s"),
			getQuery("/in.php", "method", "Turnstile", "sitekey", "s")},
		{"no method vs method", getQuery("/in.php", "textcaptcha", "2+2?"), getQuery("/in.php", "method", "post", "textcaptcha", "2+2?")},
		{"length prefix a=bc vs ab=c", getQuery("/in.php", "method", "x", "a", "bc"), getQuery("/in.php", "method", "x", "ab", "c")},
		{"length prefix value with separators", getQuery("/in.php", "method", "x", "a", "1&b=2"), getQuery("/in.php", "method", "x", "a", "1", "b", "2")},
		{"length prefix NUL and varint bytes", getQuery("/in.php", "method", "x", "a", "\x00\x01b\x01c"), getQuery("/in.php", "method", "x", "a", "", "b", "c")},
		{"length prefix value spelling another field", getQuery("/in.php", "method", "x", "a", "b"),
			getQuery("/in.php", "method", "x", "a", "b\x01p\x01cx")},
		// Without a value count, a 112-byte second value of a[] laid out as
		// "\x01b\x6d"+W would encode like a following parameter b=W (112 is
		// the kind byte 'p' read as a length).
		{"value count: array value spelling a following param", getQuery("/in.php", "method", "x", "a[]", "1", "a[]", "\x01b\x6d"+strings.Repeat("w", 109)),
			getQuery("/in.php", "method", "x", "a[]", "1", "b", strings.Repeat("w", 109))},
		{"array value count", Parse("GET", "/in.php", "method=x&a[]=1&a[]=2", nil, nil),
			Parse("GET", "/in.php", "method=x&a[]=12", nil, nil)},
		{"param name vs image name", getQuery("/in.php", "method", "base64", "image", enc),
			getQuery("/in.php", "method", "base64", "body", enc)},
		{"file part for base64 is not the image", multipartFileMethod(t, "base64", "file", img),
			multipartFile(t, testKey, img)},
		{"body for post is not the image", postForm("key", testKey, "method", "post", "body", enc),
			postForm("key", testKey, "method", "base64", "body", enc)},
		{"undecodable base64 vs the same bytes as a file", postForm("method", "base64", "body", "not base64!!"),
			multipartFileField(t, "", "post", "file", []byte("not base64!!"))},
		{"undecodable base64 vs its bytes base64-encoded", postForm("method", "base64", "body", "not base64!!"),
			postForm("method", "base64", "body", b64([]byte("not base64!!")))},
		{"padding only", postForm("method", "base64", "body", "===="), postForm("method", "base64", "body", "=")},
		{"mixed alphabets do not decode", postForm("method", "base64", "body", "ab+_"),
			postForm("method", "base64", "body", "ab+/")},
		{"imginstructions differ", getQuery("/in.php", "method", "base64", "body", enc, "imginstructions", b64([]byte("hint-1"))),
			getQuery("/in.php", "method", "base64", "body", enc, "imginstructions", b64([]byte("hint-2")))},
		{"bls image order", getQuery("/in.php", "method", "bls", "image_base64_1", b64([]byte("one")), "image_base64_2", b64([]byte("two"))),
			getQuery("/in.php", "method", "bls", "image_base64_1", b64([]byte("two")), "image_base64_2", b64([]byte("one")))},
		{"rotate file order", multipartFiles(t, "rotatecaptcha", "file_1", "A", "file_2", "B"),
			multipartFiles(t, "rotatecaptcha", "file_1", "B", "file_2", "A")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fa, fb := tc.a.Fingerprint(), tc.b.Fingerprint()
			if fa == fb {
				t.Errorf("fingerprints collide: %s", fa)
			}
		})
	}
}

// multipartFileMethod submits img as a file part named field with method m.
func multipartFileMethod(t testing.TB, m, field string, img []byte) *Request {
	return multipartFileField(t, testKey, m, field, img)
}

func multipartFileField(t testing.TB, key, m, field string, data []byte) *Request {
	t.Helper()
	body, ct := multipartBody(t, part{Name: "key", Value: key}, part{Name: "method", Value: m},
		part{Name: field, File: true, Filename: "x.png", Value: string(data)})
	return Parse(http.MethodPost, "/in.php", "", hdr(ct), body)
}

// multipartFiles submits method m with file parts given as field, data pairs.
func multipartFiles(t testing.TB, m string, fd ...string) *Request {
	t.Helper()
	parts := []part{{Name: "key", Value: testKey}, {Name: "method", Value: m}}
	for i := 0; i+1 < len(fd); i += 2 {
		parts = append(parts, part{Name: fd[i], File: true, Filename: fd[i] + ".png", Value: fd[i+1]})
	}
	body, ct := multipartBody(t, parts...)
	return Parse(http.MethodPost, "/in.php", "", hdr(ct), body)
}

func TestFingerprintCollides(t *testing.T) {
	rc := []string{"key", testKey, "method", "userrecaptcha", "googlekey", siteKey, "pageurl", pageURL}
	with := func(kv ...string) *Request { return getQuery("/in.php", append(append([]string{}, rc...), kv...)...) }
	hint := []byte("\x89PNG hint image")
	bls1, bls2 := []byte("cell image one"), []byte("cell image two")

	tests := []struct {
		name string
		a, b *Request
	}{
		{"volatile json", with(), with("json", "1")},
		{"volatile json 0 vs 1", with("json", "0"), with("json", "1")},
		{"volatile header_acao", with(), with("header_acao", "1")},
		{"volatile soft_id", with("soft_id", "4580"), with("soft_id", "4587")},
		{"volatile pingback", with(), with("pingback", "https://cb.example.com/x")},
		{"volatile filename and ext", with(), with("filename", "a.png", "ext", "png")},
		{"default version", with(), with("version", "v2")},
		{"default enterprise", with(), with("enterprise", "0")},
		{"default invisible", with(), with("invisible", "0")},
		{"all defaults spelt out (2captcha-python)", with(), with("version", "v2", "enterprise", "0", "invisible", "0")},
		{"empty default ≡ default", with("version", ""), with("version", "v2")},
		{"JSON false ≡ default 0", Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
			[]byte(`{"key":"`+testKey+`","method":"userrecaptcha","googlekey":"`+siteKey+`","pageurl":"`+pageURL+`","invisible":false,"json":1}`)), with()},
		{"JSON true ≡ 1", Parse(http.MethodPost, "/in.php", "", hdr("application/json"),
			[]byte(`{"key":"`+testKey+`","method":"userrecaptcha","googlekey":"`+siteKey+`","pageurl":"`+pageURL+`","invisible":true}`)), with("invisible", "1")},
		{"empty value ≡ absent", with(), with("cookies", "", "action", "", "data-s", "")},
		{"parameter order", getQuery("/in.php", "key", testKey, "method", "turnstile", "sitekey", "s", "pageurl", pageURL, "action", "a"),
			getQuery("/in.php", "action", "a", "pageurl", pageURL, "sitekey", "s", "method", "turnstile", "key", testKey)},
		{"query vs form vs JSON", getQuery("/in.php", "key", testKey, "method", "turnstile", "sitekey", "s", "min_score", "0.3"),
			Parse(http.MethodPost, "/in.php", "", hdr("application/json"), []byte(`{"key":"`+testKey+`","method":"turnstile","sitekey":"s","min_score":0.3}`))},
		{"key in query vs body", Parse(http.MethodPost, "/in.php", "key="+testKey, hdr(formType), []byte("method=turnstile&sitekey=s")),
			postForm("method", "turnstile", "sitekey", "s", "key", testKey)},
		{"repeated name, last wins", Parse("GET", "/in.php", "method=turnstile&sitekey=old&sitekey=s", nil, nil),
			getQuery("/in.php", "method", "turnstile", "sitekey", "s")},
		{"imginstructions file vs base64", multipartWithHint(t, hint, true),
			multipartWithHint(t, hint, false)},
		{"imginstructions data URI", getQuery("/in.php", "method", "base64", "body", b64([]byte("x")), "imginstructions", b64(hint)),
			getQuery("/in.php", "method", "base64", "body", b64([]byte("x")), "imginstructions", "data:image/png;base64,"+b64(hint))},
		{"bls data URI vs plain", getQuery("/in.php", "method", "bls", "instructions", "664",
			"image_base64_1", "data:image/gif;base64,"+b64(bls1), "image_base64_2", "data:image/gif;base64,"+b64(bls2)),
			getQuery("/in.php", "method", "bls", "instructions", "664", "image_base64_2", b64(bls2), "image_base64_1", b64(bls1))},
		{"rotate files reordered in the body", multipartFiles(t, "rotatecaptcha", "file_1", "A", "file_2", "B"),
			multipartFiles(t, "rotatecaptcha", "file_2", "B", "file_1", "A")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.a.Understood || !tc.b.Understood {
				t.Fatal("fixture not understood")
			}
			if fa, fb := tc.a.Fingerprint(), tc.b.Fingerprint(); fa != fb {
				t.Errorf("fingerprints differ:\n%s %q\n%s %q", fa, tc.a.Params, fb, tc.b.Params)
			}
		})
	}
}

// multipartWithHint is a base64 image submission whose imginstructions is a
// file part (asFile) or a base64 text part.
func multipartWithHint(t testing.TB, hint []byte, asFile bool) *Request {
	t.Helper()
	parts := []part{{Name: "key", Value: testKey}, {Name: "method", Value: "base64"},
		{Name: "body", Value: b64([]byte("main image"))}, {Name: "textinstructions", Value: "select cars"}}
	if asFile {
		parts = append(parts, part{Name: "imginstructions", File: true, Filename: "hint.png", Value: string(hint)})
	} else {
		parts = append(parts, part{Name: "imginstructions", Value: b64(hint)})
	}
	body, ct := multipartBody(t, parts...)
	return Parse(http.MethodPost, "/in.php", "", hdr(ct), body)
}

func TestFingerprintShape(t *testing.T) {
	for _, key := range []string{testKey, otherKey, "", "short"} {
		r := getQuery("/in.php", "key", key, "method", "turnstile", "sitekey", "s")
		fp := r.Fingerprint()
		if !strings.HasPrefix(fp, r.Account()+":") {
			t.Errorf("Fingerprint %q does not start with Account %q", fp, r.Account())
		}
		if key != "" && strings.Contains(fp, key) {
			t.Errorf("Fingerprint %q contains the key", fp)
		}
		hexPart := fp[len(r.Account())+1:]
		if len(hexPart) != 32 || strings.Trim(hexPart, "0123456789abcdef") != "" {
			t.Errorf("Fingerprint hash part %q, want 32 hex digits", hexPart)
		}
		for range 20 { // map iteration order must not matter
			if again := r.Fingerprint(); again != fp {
				t.Fatalf("Fingerprint not stable: %s then %s", fp, again)
			}
		}
	}
	if fp := getQuery("/in.php", "method", "x").Fingerprint(); !strings.HasPrefix(fp, "nokey:") {
		t.Errorf("no key: %q", fp)
	}
}

// TestFingerprintPinned pins the canonical encoding: fingerprints are
// stored, so a change must come with a new fingerprintVersion.
func TestFingerprintPinned(t *testing.T) {
	r := getQuery("/in.php", "key", testKey, "method", "userrecaptcha", "googlekey", siteKey, "pageurl", pageURL)
	if got := r.Fingerprint(); got != pinnedFingerprint {
		t.Errorf("Fingerprint = %s, want %s (bump fingerprintVersion if the encoding changed on purpose)", got, pinnedFingerprint)
	}
}

const pinnedFingerprint = "c3a26866d47a06cb:f2dfc8e8ebaf6fea692388b2f8098b71"

func TestFingerprintFamily(t *testing.T) {
	for m, want := range map[string]Family{"post": FamilyImage, "base64": FamilyImage, "userrecaptcha": "userrecaptcha",
		"": "", "POST": "POST", "turnstile": "turnstile"} {
		if got := getQuery("/in.php", "method", m).Family(); got != want {
			t.Errorf("Family(%q) = %q, want %q", m, got, want)
		}
	}
}

func TestDecodeBase64Image(t *testing.T) {
	img := imageWithPlus(t, 100)
	enc := b64(img)
	tests := []struct {
		name string
		in   string
		want []byte // nil: must fail
	}{
		{"standard", enc, img},
		{"no padding", strings.TrimRight(enc, "="), img},
		{"extra padding", enc + "==", img},
		{"url alphabet", base64.URLEncoding.EncodeToString(img), img},
		{"data URI", "data:image/png;base64," + enc, img},
		{"data URI without base64 marker", "data:image/png," + enc, img},
		{"surrounding space", "  \n" + enc + "\r\n ", img},
		{"line breaks", wrapLines(enc, 76, "\r\n"), img},
		{"tabs", wrapLines(enc, 10, "\t"), img},
		{"plus as space", strings.ReplaceAll(enc, "+", " "), img},
		{"one byte", "YQ==", []byte("a")},
		{"two bytes", "YWI", []byte("ab")},
		{"trailing bits ignored", "YR", []byte("a")},
		{"empty", "", nil},
		{"only padding", "===", nil},
		{"data URI without comma", "data:image/png;base64" + enc, nil},
		{"data URI empty payload", "data:image/png;base64,", nil},
		{"single char", "Y", nil},
		{"five chars", "YWJjZ", nil},
		{"data after padding", "YQ==YQ==", nil},
		{"space after padding", "YQ= =", nil},
		{"invalid char", "YW*j", nil},
		{"non-ASCII", "YWJj\u00e9", nil},
		{"vertical tab", "YW\vJj", nil},
		{"mixed alphabets", "ab+_", nil},
		{"percent-encoded", "YW%2Bj", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DecodeBase64Image(tc.in)
			if ok != (tc.want != nil) || !bytes.Equal(got, tc.want) {
				t.Errorf("DecodeBase64Image(%.30q) = %q, %v; want %q", tc.in, got, ok, tc.want)
			}
		})
	}
}

// refDecodeBase64Image is the original, allocation-heavy implementation: the
// single-pass decoder must agree with it on every input.
func refDecodeBase64Image(s string) ([]byte, bool) {
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

func TestDecodeBase64ImageMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_= \r\n\t*:,."
	check := func(s string) {
		got, gok := DecodeBase64Image(s)
		want, wok := refDecodeBase64Image(s)
		if gok != wok || !bytes.Equal(got, want) {
			t.Fatalf("DecodeBase64Image(%q) = %q, %v; reference %q, %v", s, got, gok, want, wok)
		}
	}
	for range 200000 {
		n := r.IntN(24)
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		s := string(b)
		if r.IntN(8) == 0 {
			s = "data:image/png;base64," + s
		}
		check(s)
	}
	for i := range 300 {
		img := fakeImage(i, uint64(i))
		for _, s := range []string{b64(img), base64.RawURLEncoding.EncodeToString(img), wrapLines(b64(img), 7, "\n")} {
			check(s)
		}
	}
}

func BenchmarkFingerprint(b *testing.B) {
	img := fakeImage(20<<10, 1)
	body, ct := multipartBody(b,
		part{Name: "key", Value: testKey},
		part{Name: "method", Value: "post"},
		part{Name: "json", Value: "1"},
		part{Name: "soft_id", Value: "4585"},
		part{Name: "numeric", Value: "1"},
		part{Name: "file", File: true, Filename: "captcha.png", Type: "image/png", Value: string(img)},
	)
	image := Parse(http.MethodPost, "/in.php", "", hdr(ct), body)
	token := getQuery("/in.php",
		"key", testKey, "method", "userrecaptcha", "googlekey", siteKey,
		"pageurl", pageURL, "json", "1", "soft_id", "4580",
		"version", "v2", "enterprise", "0")
	b64req := postForm("key", testKey, "method", "base64", "json", "1", "numeric", "1", "body", b64(img))
	if !image.Understood || len(image.Files) != 1 || !token.Understood {
		b.Fatal("fixtures not understood")
	}
	for _, c := range []struct {
		name string
		r    *Request
	}{{"image-multipart-20KB", image}, {"image-base64-20KB", b64req}, {"userrecaptcha", token}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.r.Fingerprint()
			}
		})
	}
}

// TestConcurrentUse: a parsed Request and Answer are read-only, so the
// proxy may fingerprint, forward and render them from many goroutines
// (run with -race).
func TestConcurrentUse(t *testing.T) {
	r := multipartFile(t, testKey, fakeImage(4000, 8), "numeric", "1")
	b := postForm("key", testKey, "method", "base64", "body", b64(fakeImage(4000, 8)), "numeric", "1")
	a, err := ParseAnswer([]byte(`{"status":1,"request":73046487691,"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	want := r.Fingerprint()
	base := mustURL(t, "https://ocr.captchaai.com")
	done := make(chan string, 16)
	for range cap(done) {
		go func() {
			fp := r.Fingerprint()
			if b.Fingerprint() != fp {
				fp = "mismatch"
			}
			if _, err := r.Outgoing(t.Context(), base); err != nil {
				fp = err.Error()
			}
			_ = a.Render(FormatText)
			_ = a.Render(FormatJSON)
			done <- fp
		}()
	}
	for range cap(done) {
		if got := <-done; got != want {
			t.Errorf("goroutine got %q, want %q", got, want)
		}
	}
}
