package admin

import (
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestHorizonReason: which holders of the vacuum horizon make /readyz
// degraded (the database side is TestReadinessDegradedByAHeldVacuumHorizon).
func TestHorizonReason(t *testing.T) {
	t.Parallel()
	since := time.Now()
	for _, c := range []struct {
		name   string
		holder *store.HorizonHolder
		want   string
	}{
		{"none", nil, ""},
		{"young session", &store.HorizonHolder{Kind: "session", ID: "42", Since: &since, AgeSeconds: 299}, ""},
		{"old session", &store.HorizonHolder{Kind: "session", ID: "42", Application: "psql", Role: "analyst", State: "idle in transaction",
			Since: &since, AgeSeconds: 301.7},
			"session 42 (psql, analyst, idle in transaction) has held back vacuum for 5m1s (the threshold is 5m0s): the hot tables keep every dead row until it ends"},
		{"old prepared transaction", &store.HorizonHolder{Kind: "prepared transaction", ID: "tx-7", Since: &since, AgeSeconds: 3600},
			"prepared transaction tx-7 has held back vacuum for 1h0m0s (the threshold is 5m0s): the hot tables keep every dead row until it ends"},
		{"active slot", &store.HorizonHolder{Kind: "replication slot", ID: "auditors", State: "active", XIDAge: 1 << 30}, ""},
		{"inactive slot", &store.HorizonHolder{Kind: "replication slot", ID: "auditors", State: "inactive", XIDAge: 12},
			"the inactive replication slot auditors holds back vacuum (12 transaction ids): its standby is gone; drop the slot or reconnect the standby"},
		{"standby", &store.HorizonHolder{Kind: "standby", ID: "77", XIDAge: 1 << 30}, ""},
	} {
		if got := horizonReason(c.holder, 5*time.Minute); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
