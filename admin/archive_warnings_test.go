package admin_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
)

// TestOverviewWarnsOfArchiveUpkeep: the overview says where the archive's
// upkeep stands on the console's page, and warns, in the API and on the
// page, when fewer than 3 months from this one on have their partition
// (upkeep stopped: a month later this month's rows go to the default
// partition).
func TestOverviewWarnsOfArchiveUpkeep(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 || len(ov.ArchiveWarnings) != 0 ||
		ov.Queue.Archive.MonthsReady != 4 {
		t.Fatalf("a new schema's overview: %d %+v", code, ov)
	}
	console := consoleAt(t, b.url)
	if page := console.get(t, "/console/"); !strings.Contains(page, "Archive: no checkpoint yet; 4 months from this one on with their partition; 0 rows in the default partition.") {
		t.Fatalf("the console's overview does not say where the archive stands:\n%s", page)
	}
	if _, err := b.pool.Exec(b.ctx, `DO $$ BEGIN
		EXECUTE format('ALTER TABLE outbox.attempts DETACH PARTITION outbox.%I', 'attempts_' || to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + interval '2 months', 'YYYY_MM'));
	END $$`); err != nil {
		t.Fatal(err)
	}
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond) // each read fresh
	want := "Only 2 months of the archive from this one on have their partition"
	ov = admin.Overview{}
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 {
		t.Fatalf("overview: %d", code)
	}
	if len(ov.ArchiveWarnings) != 1 || !strings.HasPrefix(ov.ArchiveWarnings[0], want) {
		t.Fatalf("overview's archive warnings %q, want one starting %q", ov.ArchiveWarnings, want)
	}
	if page := console.get(t, "/console/"); !strings.Contains(page, fmt.Sprintf(`<p class="warning">%s`, want)) {
		t.Fatalf("the console's overview lacks the warning %q:\n%s", want, page)
	}
}
