package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPartitionBoundsUnderAnyTimeZone: the archive's partitions are listed
// with their true bounds whatever the session's TimeZone and DateStyle.
// The bounds were read back from their text, which a DateStyle other than
// ISO writes with the zone's abbreviation: in Asia/Kolkata "IST", which
// PostgreSQL reads as Israel's, so every month began at 03:30 UTC. The
// detach then moved a month under those bounds (or refused it) and an
// export read the month without its first hours.
func TestPartitionBoundsUnderAnyTimeZone(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	for _, zone := range []string{"Asia/Kolkata", "Asia/Shanghai", "America/Sao_Paulo"} {
		for _, style := range []string{"Postgres, DMY", "SQL, MDY", "German", "ISO, DMY"} {
			cfg := b.pool.Config().Copy()
			cfg.ConnConfig.RuntimeParams["TimeZone"] = zone
			cfg.ConnConfig.RuntimeParams["DateStyle"] = style
			pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			parts, err := b.st.Partitions(b.ctx, pool, false)
			pool.Close()
			if err != nil {
				t.Fatal(err)
			}
			months := 0
			for _, p := range parts {
				if p.State == "default" {
					continue
				}
				months++
				name := "attempts_" + p.From.Format("2006_01")
				if p.Name != name || !p.From.Equal(time.Date(p.From.Year(), p.From.Month(), 1, 0, 0, 0, 0, time.UTC)) ||
					!p.To.Equal(p.From.AddDate(0, 1, 0)) {
					t.Errorf("%s, %s: %s listed from %s to %s", zone, style, p.Name, p.From, p.To)
				}
			}
			if months == 0 {
				t.Fatalf("%s, %s: no month listed: %+v", zone, style, parts)
			}
		}
	}
}

// TestEnsurePartitionsUnderAnyTimeZone: partition upkeep run by a session
// in Asia/Kolkata with an SQL DateStyle creates the month with its UTC
// bounds. ensure_attempt_partitions wrote the bounds into its DDL in the
// session's DateStyle ("01/12/2026 05:30:00 IST"), read back as Israel's
// time: the month began at 03:30 UTC, its first hours went to the previous
// month's gap, the default partition (migration 041).
func TestEnsurePartitionsUnderAnyTimeZone(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.EnsurePartitions(b.ctx, b.pool, 3); err != nil {
		t.Fatal(err)
	}
	var start time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '3 months') AT TIME ZONE 'UTC'`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	month := "attempts_" + start.UTC().Format("2006_01")
	execAll(t, b.pool, "DROP TABLE outbox."+month)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["TimeZone"] = "Asia/Kolkata"
	cfg.ConnConfig.RuntimeParams["DateStyle"] = "SQL, DMY"
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := b.st.EnsurePartitions(b.ctx, pool, 3); err != nil {
		t.Fatal(err)
	}
	parts, err := b.st.Partitions(b.ctx, b.pool, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if p.Name == month {
			if !p.From.Equal(start) || !p.To.Equal(start.AddDate(0, 1, 0)) {
				t.Fatalf("%s created from %s to %s, want from %s", month, p.From, p.To, start.UTC())
			}
			return
		}
	}
	t.Fatalf("%s not created: %+v", month, parts)
}

// TestReaperMessageUnderAnyTimeZone: the message a reaper archives with a
// reaped claim (a ZOMBIE_REQUEUE row, or a poison instruction's dead
// letter) states the lease's end and the claim's time in UTC, in one form,
// whatever the reaper session's TimeZone and DateStyle. They were written
// in the session's: under Asia/Kolkata with an SQL DateStyle as
// "29/11/2026 16:59:39.146 IST", an abbreviation PostgreSQL itself reads
// as Israel's, into a row of the archive that can never be corrected.
func TestReaperMessageUnderAnyTimeZone(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["TimeZone"] = "Asia/Kolkata"
	cfg.ConnConfig.RuntimeParams["DateStyle"] = "SQL, DMY"
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", shortLease)
	b.waitExpired(t, c)
	if _, err := b.st.Reap(b.ctx, pool, 10, "kolkata-reaper", 0); err != nil {
		t.Fatal(err)
	}
	var msg string
	if err := b.pool.QueryRow(b.ctx, `SELECT error_message FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE' AND claim_attempt_id = $1`,
		c.AttemptID).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }
	if want := "expired at " + stamp(c.LeaseUntil) + " (claimed at " + stamp(c.ClaimedAt) + ","; !strings.Contains(msg, want) {
		t.Errorf("reaper's message %q, want it to say %q", msg, want)
	}
}
