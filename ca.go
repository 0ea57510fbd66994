package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/proxy"
)

func init() { subcommands["ca"] = runCA }

// runCA is `solveonce ca [flags]`: it prints the MITM CA certificate (PEM)
// on stdout, so users can install it in their clients' trust stores. The
// CA is the one the proxy would use with the same -config, -ca-cert and
// -ca-key (and environment); it is created first when its files are
// absent, exactly as the proxy would.
func runCA(_ context.Context, args, environ []string, stdout, stderr io.Writer) error {
	cfg, help, err := configure(args, environ, stderr)
	if help || err != nil {
		return err
	}
	resolveDataDir(&cfg, environ)
	certFile, keyFile, err := cfg.Proxy.CAFiles()
	if err != nil {
		return err
	}
	ca, err := proxy.LoadOrCreateCA(certFile, keyFile, newLogger(cfg.Log, stderr))
	if err != nil {
		return err
	}
	if _, err := stdout.Write(ca.CertPEM); err != nil {
		return fmt.Errorf("write CA certificate: %w", err)
	}
	return nil
}

// resolveDataDir replaces an empty data_dir by its default,
// $XDG_CONFIG_HOME/solveonce or else $HOME/.config/solveonce, and gives it
// to the proxy, whose CA files default to it. Without either variable the
// directory stays empty; the proxy then needs ca_cert and ca_key.
func resolveDataDir(cfg *config.File, environ []string) {
	if cfg.DataDir == "" {
		base := lookupEnv(environ, "XDG_CONFIG_HOME")
		if base == "" {
			if home := lookupEnv(environ, "HOME"); home != "" {
				base = filepath.Join(home, ".config")
			}
		}
		if base != "" {
			cfg.DataDir = filepath.Join(base, "solveonce")
		}
	}
	cfg.Proxy.DataDir = cfg.DataDir
}
