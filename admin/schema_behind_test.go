package admin_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/migrations"
)

// TestResumeOnASchemaBeforeItsMigration: a resume of the pause shown (the
// console's, the API's with paused_at) runs resume_rail_shown, which
// migration 047 adds. On a schema before it (a relayer upgraded before
// its migration ran) it answered 500 INTERNAL; it answers 503
// SCHEMA_BEHIND (ErrSchemaBehind from ResumeRailShown), saying to run
// outbox migrate, and does not fall back to a resume by name, which
// would end whatever pause is in force: the pause stays.
func TestResumeOnASchemaBeforeItsMigration(t *testing.T) {
	t.Parallel()
	const schema = "before047"
	b := setup(t, admin.Config{Schema: schema})
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 46}); err != nil {
		t.Fatal(err)
	}
	reason := map[string]any{"reason": "maintenance"}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, reason, nil); code != http.StatusOK {
		t.Fatalf("pause on a schema at 046: %d", code)
	}
	shown := b.pausedAt(t, "sandbox")
	if shown == nil {
		t.Fatal("no pause shown")
	}
	var body map[string]any
	code := b.call(t, "POST", "/api/v1/rails/sandbox/resume", operatorSecret,
		map[string]any{"reason": "maintenance over", "paused_at": shown}, &body)
	if code != http.StatusServiceUnavailable || body["code"] != admin.SchemaBehind || !strings.Contains(body["note"].(string), "outbox migrate") || body["done"] != false {
		t.Errorf("API resume of the pause shown on a schema at 046: %d %v, want 503 %s naming outbox migrate", code, body, admin.SchemaBehind)
	}
	operator := consoleAs(t, b.url, operatorSecret)
	page := operator.post(t, "/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"maintenance over"},
		"paused": {strconv.FormatInt(shown.UnixMicro(), 10)}})
	if !strings.Contains(page, "outbox migrate") {
		t.Errorf("the console's resume on a schema at 046 does not say to migrate:\n%s", page)
	}
	if b.pausedAt(t, "sandbox") == nil {
		t.Fatal("the pause was ended: a resume fell back to resume_rail")
	}
	// Migrated, the same resume ends it.
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/resume", operatorSecret,
		map[string]any{"reason": "maintenance over", "paused_at": shown}, nil); code != http.StatusOK {
		t.Errorf("resume once migrated: %d", code)
	}
}
