package retry

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ledgerline/outbox/migrations"
)

// Preflight is the check a long-running service (who: "relayer",
// "reaper") makes before it starts. An error no retry can fix (Permanent:
// credentials, a missing database or privilege, a schema not migrated or
// older than this build, a *migrations.SchemaError) is returned, explained,
// and the service must not start. A database that cannot be reached is
// not such an error: it is logged, and the service starts and keeps
// trying. A schema newer than this build (a rolling deploy migrated it
// first) is logged too. checked says whether the schema was found ready:
// false when the database could not be asked, and the service must then
// ask again before it relies on the schema.
func Preflight(ctx context.Context, db migrations.DB, schema string, log *slog.Logger, who string) (checked bool, err error) {
	st, err := migrations.Ready(ctx, db, schema)
	switch {
	case err != nil && Permanent(err):
		return false, fmt.Errorf("cannot start: %w", Explain(err))
	case err != nil:
		log.Warn("database not reachable at start; the "+who+" starts anyway and keeps trying", "err", err)
		return false, nil
	case st.Current > st.Latest:
		log.Warn("the schema is newer than this build (a newer version migrated it); upgrade this "+who,
			"schema", st.Schema, "version", st.Current, "build_version", st.Latest)
	}
	return true, nil
}
