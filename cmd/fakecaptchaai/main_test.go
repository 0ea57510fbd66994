package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // serve until "signalled": at once
	var out, errOut bytes.Buffer
	err := run(ctx, []string{"-listen", "127.0.0.1:0", "-solve-after", "15s", "-latency", "0", "-fail-ratio", "0.5", "-fault", "html500", "-keys", "a,b"}, &out, &errOut)
	require.NoError(t, err)
	require.Regexp(t, `^http://127\.0\.0\.1:[0-9]+\n$`, out.String())
	require.Contains(t, errOut.String(), "shutting down")
}

func TestRunFlags(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		args []string
		ok   bool
	}{
		{"polls", []string{"-listen", "127.0.0.1:0", "-solve-after", "0"}, true},
		{"bad fault", []string{"-fault", "explode"}, false},
		{"bad solve-after", []string{"-solve-after", "soon"}, false},
		{"negative solve-after", []string{"-solve-after", "-1"}, false},
		{"bad ratio", []string{"-fail-ratio", "2"}, false},
		{"bad endpoint", []string{"-fault-endpoint", "solve.php"}, false},
		{"extra args", []string{"now"}, false},
	}
	for _, c := range cases {
		err := run(ctx, c.args, io.Discard, io.Discard)
		if c.ok {
			require.NoError(t, err, c.name)
		} else {
			require.Error(t, err, c.name)
		}
	}
	var usage bytes.Buffer
	err := run(ctx, []string{"-h"}, io.Discard, &usage)
	require.True(t, errors.Is(err, flag.ErrHelp))
	require.Contains(t, usage.String(), "without spending money")
	require.Contains(t, usage.String(), "-solve-after")
}
