package migrations_test

import (
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/migrations"
)

// TestLostHandoffsAsRelayerRole: the look a relayer makes after an outcome
// write's commit reply was lost (store.LostHandoffs: the archive's and the
// in-flight table's xmin) is allowed to outbox_relayer.
func TestLostHandoffsAsRelayerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	lost, err := b.st.LostHandoffs(b.ctx, relayer, "r-1", uuid.Must(uuid.NewV7()), time.Now())
	if err != nil || len(lost) != 0 {
		t.Fatalf("lost hand-offs as %s: %+v, %v", migrations.RoleRelayer, lost, err)
	}
}

// TestLostClaimsAsRelayerRole: the look a relayer makes after a claim's
// commit reply was lost (store.LostClaims: the in-flight table's and the
// archive's xmin) is allowed to outbox_relayer.
func TestLostClaimsAsRelayerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	lost, err := b.st.LostClaims(b.ctx, relayer, "r-1", uuid.Must(uuid.NewV4()), time.Now().Add(-time.Hour), nil)
	if err != nil || len(lost) != 0 {
		t.Fatalf("lost claims as %s: %+v, %v", migrations.RoleRelayer, lost, err)
	}
}
