package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// runArchive lists the archive's partitions, detaches old months, or
// exports one partition to a CSV file with its checksum.
func runArchive(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "archive", "archive [flags] list | detach --before YYYY-MM | export --partition NAME --out FILE")
	var db dbFlags
	db.register(fs, auditSettings())
	exact := fs.Bool("exact", false, "list: count each partition's rows instead of estimating them (reads the whole archive: use a replica)")
	beforeMonth := fs.String("before", "", "detach: detach every month before this one (YYYY-MM, UTC) and retire the keys of the instructions that ended in them (acknowledged dead letters leave with theirs)")
	lockTimeout := fs.Duration("detach-lock-timeout", 5*time.Second, "detach: give up on a partition whose lock is not granted within this (relayers queue behind a waiting detach)")
	partition := fs.String("partition", "", "export: the partition to export (a name from archive list)")
	outFile := fs.String("out", "", "export: the CSV file to write; its SHA-256 goes to FILE.sha256 (sha256sum format)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: archive needs list, detach or export", errUsage)
	}
	var before time.Time
	switch fs.Arg(0) {
	case "list":
	case "detach":
		t, err := time.Parse("2006-01", *beforeMonth)
		if err != nil {
			return fmt.Errorf("%w: detach needs --before YYYY-MM (got %q)", errUsage, *beforeMonth)
		}
		before = t
	case "export":
		if *partition == "" || *outFile == "" {
			return fmt.Errorf("%w: export needs --partition and --out", errUsage)
		}
	default:
		return fmt.Errorf("%w: archive needs list, detach or export, not %q", errUsage, fs.Arg(0))
	}
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	switch fs.Arg(0) {
	case "list":
		parts, err := archive.Partitions(ctx, pool, *exact)
		if err != nil {
			return err
		}
		for _, p := range parts {
			line := map[string]any{"partition": p.Name, "state": p.State, "rows": p.Rows, "bytes": p.Bytes, "rows_exact": *exact}
			if !p.From.IsZero() {
				line["from"], line["to"] = p.From, p.To
			}
			if !p.KeysRetired.IsZero() {
				line["keys_retired_at"], line["retired_keys"] = p.KeysRetired, p.RetiredKeys
			}
			_ = out.Encode(line)
		}
		return nil
	case "detach":
		detached, retired, err := archive.Detach(ctx, pool, before, *lockTimeout)
		_ = out.Encode(map[string]any{"before": before.Format("2006-01"), "detached": detached, "retired_keys": retired, "ok": err == nil})
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	f, err := os.Create(*outFile)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	h := sha256.New()
	rows, err := archive.Export(ctx, conn.Conn(), *partition, io.MultiWriter(f, h))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(*outFile)
		return err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if err := os.WriteFile(*outFile+".sha256", fmt.Appendf(nil, "%s  %s\n", sum, filepath.Base(*outFile)), 0o644); err != nil {
		return err
	}
	return out.Encode(map[string]any{"partition": *partition, "rows": rows, "file": *outFile, "sha256": sum})
}
