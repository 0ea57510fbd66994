package cache

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/solveonce/solveonce/captchaai"
)

func TestPutChoosesTTLFromAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, err := New(Config{DoneTTL: time.Minute, PendingTTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		solved := captchaai.OK("answer")
		pending := captchaai.Text(captchaai.NotReady)
		transient := captchaai.Text("ERROR_NO_SLOT_AVAILABLE")
		terminal := captchaai.Text("ERROR_CAPTCHA_UNSOLVABLE")
		if !a.Put("solved", solved, 0) || !a.Put("pending", pending, 0) || !a.Put("terminal", terminal, 0) {
			t.Fatal("put dropped on an empty cache")
		}
		if a.Put("transient", transient, 0) {
			t.Fatal("a transient error must never be cached as an answer")
		}
		for _, k := range []string{"solved", "pending", "terminal"} {
			if _, ok := a.Get(k); !ok {
				t.Fatalf("%s not visible right after Put", k)
			}
		}
		time.Sleep(3 * time.Second)
		if _, ok := a.Get("pending"); ok {
			t.Fatal("CAPCHA_NOT_READY outlived pending_ttl")
		}
		if _, ok := a.Get("solved"); !ok {
			t.Fatal("solution expired before done_ttl")
		}
		time.Sleep(time.Minute)
		if _, ok := a.Get("solved"); ok {
			t.Fatal("solution outlived done_ttl")
		}
		// An explicit TTL wins.
		a.Put("token", solved, 5*time.Second)
		time.Sleep(6 * time.Second)
		if _, ok := a.Get("token"); ok {
			t.Fatal("explicit ttl ignored")
		}
	})
}

func TestDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.MaxBytes != 64<<20 || c.DoneTTL != 10*time.Minute || c.PendingTTL != 2*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
}
