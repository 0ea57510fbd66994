package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The shipped config.toml must list exactly the defaults: parsing it onto
// the defaults changes nothing, and parsing it onto a zero File gives the
// defaults (so every key is present).
func TestShippedFileIsTheDefaults(t *testing.T) {
	b, err := os.ReadFile("../config.toml")
	if err != nil {
		t.Fatal(err)
	}
	var f File
	if err := Parse(strings.NewReader(string(b)), &f); err != nil {
		t.Fatalf("config.toml: %v", err)
	}
	if !reflect.DeepEqual(f, Default()) {
		t.Fatalf("config.toml differs from Default():\nfile:    %+v\ndefault: %+v", f, Default())
	}
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	cases := []struct{ name, toml, want string }{
		{"unknown key", "[upstream]\nbase_urll = \"https://x\"\n", "upstream.base_urll"},
		{"unknown section", "[nope]\na = 1\n", "nope"},
		{"bad duration", "[upstream]\ntimeout = \"30 parsecs\"\n", "timeout"},
		{"bad reuse", "[intercept.policies.image]\nreuse = \"sometimes\"\n", "sometimes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := Default()
			err := Parse(strings.NewReader(c.toml), &f)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v does not name %q", err, c.want)
			}
		})
	}
}

func TestValidateNamesEveryBadKey(t *testing.T) {
	f := Default()
	f.Upstream.BaseURL = "ftp://x"
	f.Proxy.Listen = "nope"
	f.Store.Kind = "etcd"
	f.Log.Level = "loud"
	err := f.Validate()
	if err == nil {
		t.Fatal("want error")
	}
	for _, k := range []string{"upstream.base_url", "proxy.listen", "store.kind", "log.level"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %s", err, k)
		}
	}
	if !IsError(err) {
		t.Error("IsError false")
	}
}

func TestEnvOverlay(t *testing.T) {
	f := Default()
	err := ApplyEnv(&f, []string{
		"SOLVEONCE_UPSTREAM_BASE_URL=http://127.0.0.1:9",
		"SOLVEONCE_UPSTREAM_TIMEOUT=7s",
		"SOLVEONCE_BREAKER_PROBES=3",
		"SOLVEONCE_UPSTREAM_RATE=2.5",
		"SOLVEONCE_STORE_MEMORY_MAX_ENTRIES=10",
		"PATH=/bin",
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.Upstream.BaseURL != "http://127.0.0.1:9" || f.Upstream.Timeout != 7*time.Second ||
		f.Breaker.Probes != 3 || f.Upstream.Rate != 2.5 || f.Store.Memory.MaxEntries != 10 {
		t.Fatalf("env not applied: %+v", f)
	}
	err = ApplyEnv(&f, []string{"SOLVEONCE_UPSTREAM_TIMEOUT=soon"})
	if err == nil || !strings.Contains(err.Error(), "SOLVEONCE_UPSTREAM_TIMEOUT") {
		t.Fatalf("bad env value error %v does not name the variable", err)
	}
}

func TestLoadPrecedence(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/c.toml"
	if err := os.WriteFile(path, []byte("[proxy]\nlisten = \"127.0.0.1:1111\"\n[log]\nlevel = \"debug\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Load(path, []string{"SOLVEONCE_PROXY_LISTEN=127.0.0.1:2222"})
	if err != nil {
		t.Fatal(err)
	}
	if f.Proxy.Listen != "127.0.0.1:2222" {
		t.Errorf("env must win over file: %s", f.Proxy.Listen)
	}
	if f.Log.Level != "debug" {
		t.Errorf("file must win over defaults: %s", f.Log.Level)
	}
	if _, err := Load(dir+"/missing.toml", nil); err == nil {
		t.Error("missing file must be an error")
	}
}
