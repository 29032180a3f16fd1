package migrations_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// rolesBefore052 is the roles script as the builds before migration 052
// had it: no relayer_runs.
func rolesBefore052(sql string) string {
	var lines []string
	for _, line := range strings.Split(sql, "\n") {
		if !strings.Contains(line, "relayer_runs") && !strings.Contains(line, "migration 052") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// TestRelayerRunsAsEachRole: a relayer registers its run, looks for a
// lost claim's rows beside it and removes it (store.RegisterRun,
// LostClaims, EndRun), and auditors and operators list the runs, both
// where the roles script set the roles up after the table existed and
// where the owner alone migrated a schema whose roles were set up before
// it (the migration grants them).
func TestRelayerRunsAsEachRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const upgraded = "runs_upgrade"
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: upgraded, TargetVersion: 51}); err != nil {
		t.Fatal(err)
	}
	sql, err := migrations.RolesSQL(upgraded)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(b.ctx, rolesBefore052(sql)); err != nil {
		t.Fatalf("roles at version 51: %v", err)
	}
	if err := migrations.MigrateWith(b.ctx, b.as(t, migrations.RoleOwner, ""), migrations.Options{Schema: upgraded}); err != nil {
		t.Fatalf("upgrade as the owner: %v", err)
	}
	relayer := b.as(t, migrations.RoleRelayer, "")
	for _, schema := range []string{"outbox", upgraded} {
		st := st0(t, schema)
		run := uuid.Must(uuid.NewV7())
		self, others, err := st.RegisterRun(b.ctx, relayer, store.RunParams{RunID: run, RelayerID: "r-1", Host: "h", PID: 1, ClaimsFor: time.Minute})
		if err != nil || self.RunID != run || len(others) != 0 {
			t.Fatalf("%s: register as %s: %+v, %+v, %v", schema, migrations.RoleRelayer, self, others, err)
		}
		if _, _, err := st.RegisterRun(b.ctx, relayer, store.RunParams{RunID: run, RelayerID: "r-1", ClaimsFor: time.Minute, Refresh: true}); err != nil {
			t.Fatalf("%s: refresh as %s: %v", schema, migrations.RoleRelayer, err)
		}
		if lost, err := st.LostClaims(b.ctx, relayer, "r-1", run, time.Now().Add(-time.Hour), nil); err != nil || len(lost) != 0 {
			t.Fatalf("%s: lost claims as %s: %+v, %v", schema, migrations.RoleRelayer, lost, err)
		}
		for _, role := range []string{migrations.RoleAuditor, migrations.RoleOperator} {
			if runs, err := st.Runs(b.ctx, b.as(t, role, "")); err != nil || len(runs) != 1 || runs[0].RunID != run {
				t.Errorf("%s: runs as %s: %+v, %v", schema, role, runs, err)
			}
		}
		if err := st.EndRun(b.ctx, relayer, run); err != nil {
			t.Fatalf("%s: end run as %s: %v", schema, migrations.RoleRelayer, err)
		}
		if _, err := st.ForgetEndedRuns(b.ctx, relayer, time.Hour); err != nil {
			t.Fatalf("%s: forget ended runs as %s: %v", schema, migrations.RoleRelayer, err)
		}
	}
}
