package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/poolconfig"
)

// runArchive lists the archive's partitions, detaches old months,
// exports one partition to a CSV file with its checksum, or moves the
// default partition's rows into months of their own.
func runArchive(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "archive", "archive [flags] list | detach --before YYYY-MM | export --partition NAME --out FILE | move-default   (detach, exit 4: a month whose move's connection broke and whose outcome the database could not tell, COMMIT_UNKNOWN: archive list shows where it is)")
	var db dbFlags
	db.register(fs, auditSettings())
	exact := fs.Bool("exact", false, "list: count each partition's rows instead of estimating them (reads the whole archive: use a replica)")
	beforeMonth := fs.String("before", "", "detach: detach every month before this one (YYYY-MM, UTC) and retire the keys of the instructions that ended in them (acknowledged dead letters leave with theirs)")
	lockTimeout := fs.Duration("detach-lock-timeout", 5*time.Second, "detach, move-default: give up on a partition whose lock is not granted within this (relayers queue behind a waiting detach)")
	partition := fs.String("partition", "", "export: the partition to export (a name from archive list)")
	outFile := fs.String("out", "", "export: the CSV file to write; its SHA-256 goes to FILE.sha256 (sha256sum format)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: archive needs list, detach, export or move-default", errUsage)
	}
	// Negative, it became a 1 ms wait; beyond the server's lock_timeout,
	// the server refused it once the detach had begun.
	if err := poolconfig.CheckTimeout(*lockTimeout); err != nil {
		return fmt.Errorf("%w: --detach-lock-timeout: %w", errUsage, err)
	}
	var before time.Time
	switch fs.Arg(0) {
	case "list", "move-default":
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
		return fmt.Errorf("%w: archive needs list, detach, export or move-default, not %q", errUsage, fs.Arg(0))
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
		line := map[string]any{"before": before.Format("2006-01"), "detached": detached, "retired_keys": retired, "ok": err == nil}
		// A month's move whose connection broke is settled (the months
		// listed moved): one not moved can be run again, one that cannot be
		// told is reported as the other operator actions are.
		switch {
		case errors.Is(err, attempts.ErrActionNotDone):
			line["error"], line["note"] = actionNotDone, "the connection broke before the next month's move committed, and the database shows it was not done; run it again"
		case errors.Is(err, attempts.ErrCommitUnknown):
			line["error"], line["note"] = actionCommitUnknown, "the next month's move may have been done: the connection broke after it was sent and the database could not tell; see where it is (outbox archive list) before running it again"
			_ = out.Encode(line)
			fmt.Fprintln(env.stderr, "outbox:", err)
			return exitError{code: commitUnknownCode}
		}
		_ = out.Encode(line)
		return err
	case "move-default":
		moved, err := archive.MoveDefault(ctx, pool, *lockTimeout)
		months := make([]map[string]any, len(moved))
		for i, m := range moved {
			months[i] = map[string]any{"partition": m.Partition, "from": m.From, "to": m.To, "rows": m.Rows}
		}
		_ = out.Encode(map[string]any{"moved": months, "ok": err == nil})
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	rows, sum, err := exportFile(*outFile, func(w io.Writer) (int64, error) {
		return archive.Export(ctx, conn.Conn(), *partition, w)
	})
	if err != nil {
		return err
	}
	return out.Encode(map[string]any{"partition": *partition, "rows": rows, "file": *outFile, "sha256": sum})
}

// exportFile writes an export to path and its SHA-256 to path.sha256
// (sha256sum format) so that neither is ever half-written or the earlier
// copy lost: both are written to temporary files beside them and renamed
// over them only once the export is complete and on disk. An export that
// fails (a mistyped partition, a dropped connection, an interrupt) leaves
// whatever was at path, usually the month's only copy, as it was. The
// earlier checksum file is removed before the first rename, so a crash
// from there until the second leaves an export (the earlier or the new)
// without a checksum, never one beside a checksum that is not its own. A
// process killed while writing leaves its temporary files: they are not
// swept here, as another export to path may be writing its own. The directory is synced last, so that the renames
// are on disk when it returns.
func exportFile(path string, export func(io.Writer) (int64, error)) (int64, string, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	data, err := os.CreateTemp(dir, "."+base+".*.tmp")
	if err != nil {
		return 0, "", fmt.Errorf("%w: %v", errUsage, err)
	}
	defer os.Remove(data.Name()) // after the rename, nothing is left to remove
	h := sha256.New()
	rows, err := export(io.MultiWriter(data, h))
	if err := finishTemp(data, err); err != nil {
		return 0, "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	check, err := os.CreateTemp(dir, "."+base+".sha256.*.tmp")
	if err != nil {
		return 0, "", err
	}
	defer os.Remove(check.Name())
	_, err = fmt.Fprintf(check, "%s  %s\n", sum, base)
	if err := finishTemp(check, err); err != nil {
		return 0, "", err
	}
	if err := os.Remove(path + ".sha256"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, "", err
	}
	if err := os.Rename(data.Name(), path); err != nil {
		return 0, "", err
	}
	if err := os.Rename(check.Name(), path+".sha256"); err != nil {
		return 0, "", err
	}
	// A rename is in the directory, which is on disk only once synced:
	// without it a power loss after the command printed its checksum can
	// bring back the earlier export at path, or none.
	if err := syncDir(dir); err != nil {
		return 0, "", fmt.Errorf("export written, but its directory could not be synced: %w", err)
	}
	return rows, sum, nil
}

// syncDir flushes a directory's entries (the renames in it) to disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// finishTemp ends a temporary file of exportFile whose writing gave err:
// readable by all (as os.Create made exports), on disk, closed. It
// returns the first error.
func finishTemp(f *os.File, err error) error {
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
