package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable solveonce reads.
const EnvPrefix = "SOLVEONCE_"

// Secrets read only from the environment, never from the file.
const (
	EnvRedisPassword = "SOLVEONCE_REDIS_PASSWORD"
)

// ApplyEnv overlays SOLVEONCE_<SECTION>_<KEY> variables onto f, for every
// scalar key of the file (SOLVEONCE_UPSTREAM_BASE_URL sets
// upstream.base_url). Lists are comma-separated. Unknown SOLVEONCE_
// variables are ignored (they may belong to another version or to flags).
func ApplyEnv(f *File, environ []string) error {
	vals := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, EnvPrefix) {
			vals[k] = v
		}
	}
	var problems []string
	walk(reflect.ValueOf(f).Elem(), "", func(key string, v reflect.Value) {
		name := EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		s, ok := vals[name]
		if !ok {
			return
		}
		if err := setValue(v, s); err != nil {
			problems = append(problems, fmt.Sprintf("%s (%s): %v", name, key, err))
		}
	})
	if len(problems) > 0 {
		return &Error{Problems: problems}
	}
	return nil
}

// walk calls fn for every settable scalar field reachable through structs,
// with its dotted TOML key.
func walk(v reflect.Value, prefix string, fn func(key string, v reflect.Value)) {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := strings.Split(sf.Tag.Get("toml"), ",")[0]
		if !sf.IsExported() || tag == "-" || tag == "" {
			continue
		}
		key := tag
		if prefix != "" {
			key = prefix + "." + tag
		}
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[time.Duration]() {
			walk(fv, key, fn)
			continue
		}
		fn(key, fv)
	}
}

func setValue(v reflect.Value, s string) error {
	if v.Type() == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return err
		}
		v.SetUint(n)
	case reflect.Float32, reflect.Float64:
		n, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		v.SetFloat(n)
	case reflect.Slice:
		parts := strings.Split(s, ",")
		out := reflect.MakeSlice(v.Type(), 0, len(parts))
		for _, p := range parts {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			e := reflect.New(v.Type().Elem()).Elem()
			if err := setValue(e, p); err != nil {
				return err
			}
			out = reflect.Append(out, e)
		}
		v.Set(out)
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}
