package migrations_test

import (
	"testing"
	"time"

	"github.com/ledgerline/outbox/migrations"
)

// TestRetryTimesGivenBackToWaitingRows: migration 039 gives a pending row
// that waits (next_attempt_at 'infinity') the retry time its last attempt
// recorded, if still ahead, so the next promotion makes it due then:
// rows an older build put waiting behind a replay with no time. A time
// passed, a late outcome's row (it records none), a waiting row never
// attempted and a row that is due at a time of its own are left alone.
func TestRetryTimesGivenBackToWaitingRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "retry39"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 38}); err != nil {
		t.Fatal(err)
	}
	f := marksFixture{t: t, b: b, schema: schema}
	pending := func(key, due string, attempts int) {
		t.Helper()
		f.exec(`INSERT INTO marks.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			payload, attempt_count, next_attempt_at)
			VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 2, $1, 'sandbox', '{}', $3, $2::timestamptz)`, key, due, attempts)
	}
	archive := func(key, state string, retryAt string, late bool, ago string) {
		t.Helper()
		f.exec(`INSERT INTO marks.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			attempt_no, state, relayer_id, claimed_at, next_attempt_at, error_code, late, created_at)
			VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 2, $1, 'sandbox', 1, $2, 'r1', now(),
			        now() + nullif($3, '')::interval, 'RAIL_UNAVAILABLE', $4, now() - $5::interval)`, key, state, retryAt, late, ago)
	}
	pending("waits-ahead", "infinity", 1)
	archive("waits-ahead", "DISPATCHING", "", false, "2 minutes")
	archive("waits-ahead", "RETRYABLE", "1 hour", false, "1 minute")
	pending("waits-passed", "infinity", 1)
	archive("waits-passed", "RETRYABLE", "-1 minute", false, "2 minutes")
	pending("waits-late", "infinity", 1)
	archive("waits-late", "RETRYABLE", "1 hour", false, "2 minutes")
	archive("waits-late", "RETRYABLE", "", true, "1 minute")
	pending("waits-fresh", "infinity", 0)
	pending("due-later", "2100-01-01", 1)
	archive("due-later", "RETRYABLE", "1 hour", false, "1 minute")

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 39}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"waits-ahead": true, "waits-late": true}
	rows, err := b.pool.Query(b.ctx, `SELECT idempotency_key, retry_at, retry_at > now() + interval '50 minutes'
		FROM retry39.pending ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			key     string
			retryAt *time.Time
			ahead   *bool
		)
		if err := rows.Scan(&key, &retryAt, &ahead); err != nil {
			t.Fatal(err)
		}
		seen++
		if got := retryAt != nil && *ahead; got != want[key] || (retryAt != nil) != want[key] {
			t.Errorf("%s: retry_at %v after migration 039, want one an hour ahead: %v", key, retryAt, want[key])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != 5 {
		t.Errorf("%d pending rows, want 5", seen)
	}
	var since *time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT retry_times_kept_since FROM retry39.settings`).Scan(&since); err != nil || since == nil {
		t.Fatalf("settings.retry_times_kept_since %v, %v; want the migration's time", since, err)
	}
}
