package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/solveonce/solveonce/config"
	"github.com/solveonce/solveonce/pingback"
)

func init() { subcommands["dlq"] = runDLQ }

const dlqUsage = `usage: solveonce dlq list [flags]            list undeliverable pingbacks
       solveonce dlq replay [flags] [ID...] deliver them (all, or those named) once more
       solveonce dlq drop [flags] ID...|-all forget them
IDs may be shortened to any unique prefix. While solveonce runs, the
commands go through its control socket (<dlq file>.sock); otherwise they
open the file themselves.`

// runDLQ is `solveonce dlq list|replay|drop`: the pingback dead-letter
// queue (see pingback.Manager).
func runDLQ(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(stderr, dlqUsage)
		return errors.New("dlq: name a command: list, replay or drop")
	}
	verb := args[0]
	switch verb {
	case "list", "replay", "drop":
	default:
		fmt.Fprintln(stderr, dlqUsage)
		return fmt.Errorf("dlq: unknown command %q", verb)
	}
	fs := flag.NewFlagSet("solveonce dlq "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", lookupEnv(environ, "SOLVEONCE_CONFIG"), "TOML configuration `file` (env SOLVEONCE_CONFIG)")
	dataDir := fs.String("data-dir", "", "data `directory` (config data_dir)")
	path := fs.String("dlq", "", "dead-letter queue `file` (config pingback.dlq_path)")
	asJSON := fs.Bool("json", false, "print JSON")
	all := fs.Bool("all", false, "drop: every entry")
	fs.Usage = func() {
		fmt.Fprintln(stderr, dlqUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ids := fs.Args()
	if verb == "list" && len(ids) > 0 {
		return fmt.Errorf("dlq list: unexpected argument %q", ids[0])
	}
	cfg, err := config.Load(*configPath, environ)
	if err != nil {
		return err
	}
	if *dataDir != "" {
		cfg.DataDir = *dataDir
	}
	if *path != "" {
		cfg.Pingback.DLQPath = *path
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	m, err := pingback.Manage(cfg.Pingback, cfg.DataDir)
	if err != nil {
		return fmt.Errorf("dlq: %w", err)
	}
	defer m.Close()

	switch verb {
	case "list":
		entries, err := m.List(ctx)
		if err != nil {
			return fmt.Errorf("dlq list: %w", err)
		}
		if *asJSON {
			return writeDLQJSON(stdout, entries)
		}
		return printEntries(stdout, entries, m.Path())
	case "replay":
		res, err := m.Replay(ctx, ids)
		if err != nil {
			return fmt.Errorf("dlq replay: %w", err)
		}
		if *asJSON {
			if err := writeDLQJSON(stdout, res); err != nil {
				return err
			}
		} else {
			printResults(stdout, res)
		}
		failed := 0
		for _, r := range res {
			if r.Status == pingback.StatusFailed {
				failed++
			}
		}
		if failed > 0 {
			return fmt.Errorf("dlq replay: %d of %d could not be delivered; they stay in the queue", failed, len(res))
		}
		return nil
	default: // drop
		if !*all && len(ids) == 0 {
			return errors.New("dlq drop: name the entries to drop, or pass -all")
		}
		n, err := m.Drop(ctx, ids, *all)
		if err != nil {
			return fmt.Errorf("dlq drop: %w", err)
		}
		fmt.Fprintf(stdout, "dropped %d\n", n)
		return nil
	}
}

func writeDLQJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("dlq: write: %w", err)
	}
	return nil
}

// printEntries prints the queue as a table, without the answers (see
// -json for everything).
func printEntries(w io.Writer, entries []pingback.Entry, path string) error {
	if len(entries) == 0 {
		_, err := fmt.Fprintf(w, "no dead letters in %s\n", path)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tFAILED\tACCOUNT\tTASK\tATTEMPTS\tANSWER\tURL\tLAST ERROR")
	for _, e := range entries {
		answer := "known"
		if e.Code == "" {
			answer = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", shortID(e.ID), e.Failed.Local().Format(time.DateTime),
			e.Account, e.Task, e.Attempts, answer, e.URL, e.LastError)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("dlq: write: %w", err)
	}
	return nil
}

func printResults(w io.Writer, res []pingback.Result) {
	count := map[string]int{}
	for _, r := range res {
		count[r.Status]++
		line := fmt.Sprintf("%s  %-9s  task %s  %s", shortID(r.ID), r.Status, r.Task, r.Host)
		if r.Reason != "" {
			line += "  (" + r.Reason + ")"
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "delivered %d, failed %d, skipped %d\n",
		count[pingback.StatusDelivered], count[pingback.StatusFailed], count[pingback.StatusSkipped])
}

// shortID is the prefix of an entry ID shown in tables; any unique prefix
// names the entry.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
