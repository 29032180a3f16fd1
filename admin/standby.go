package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrReadOnlyStandby is returned by [Server.Act] and [Server.PauseRail]
// when the Server's database (Config.Pool) is a streaming standby, which
// refuses every write: nothing was tried. The API answers 503 with the
// code ReadOnlyStandby.
var ErrReadOnlyStandby = errors.New("admin: the database is a read-only standby")

// ReadOnlyStandby is the code the API's actions answer with (503, in the
// body's "code") when the admin address's database is a read-only
// standby: replay, acknowledge, cancel, pause and resume are taken on an
// admin address whose database is the primary.
const ReadOnlyStandby = "READ_ONLY_STANDBY"

// standbyMaxAge is how long the answer to "is the database a standby?"
// is kept: every console page asks (to show or hide the operators' forms)
// and a promotion is seen within it.
const standbyMaxAge = 5 * time.Second

// standbyWhy says what a standby cannot do and where it is done: the
// console's refusal and the API's error.
const standbyWhy = "this admin address's database is a read-only standby (in recovery); replay, acknowledge, cancel, pause and resume on an admin address whose database is the primary"

// readStandby asks the database whether it is a standby.
func (s *Server) readStandby(ctx context.Context) (bool, error) {
	var standby bool
	if err := s.cfg.Pool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby); err != nil {
		return false, fmt.Errorf("is the database a standby: %w", err)
	}
	return standby, nil
}

// onStandby says whether the database is a standby, as read within
// standbyMaxAge; a failed read says no (the page or action that follows
// meets the same database and reports its error).
func (s *Server) onStandby(ctx context.Context) bool {
	standby, err := s.standby.Get(ctx)
	return err == nil && standby
}

// refuseOnStandby returns ErrReadOnlyStandby (wrapped, with what to do)
// when the database is a standby, before an action tries a write there.
func (s *Server) refuseOnStandby(ctx context.Context) error {
	if s.onStandby(ctx) {
		return fmt.Errorf("%w: %s", ErrReadOnlyStandby, standbyWhy)
	}
	return nil
}

// writeStandby answers an API action refused with ErrReadOnlyStandby.
func writeStandby(w http.ResponseWriter) {
	writeError(w, http.StatusServiceUnavailable, ReadOnlyStandby, "nothing was done: "+standbyWhy)
}

// standbyRefusal is the console's answer to an operator's form posted to
// a console on a standby (a page shown before a failover).
const standbyRefusal = "Nothing was done: this console reads a read-only standby, where nothing can be written. Replay, acknowledge, cancel, pause and resume on the console of an admin address whose database is the primary."
