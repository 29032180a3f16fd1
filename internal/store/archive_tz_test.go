package store_test

import (
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
