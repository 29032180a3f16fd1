package admin

import "net/http"

// The API's error codes besides those of the actions (InFlight,
// RailMayStillAct, DeadLetterChanged, CommitUnknown, NotDone),
// ReadOnlyStandby, Busy and VerifyRunning: every answer other than 200
// carries one in its body's "code" (docs/operations.md, "The API's error
// codes"), so that a client tells refusals apart without reading words.
const (
	// Unauthorized (401): no credential, or one that is not known.
	Unauthorized = "UNAUTHORIZED"
	// Forbidden (403): the credential's role may not do this (an
	// auditor's action).
	Forbidden = "FORBIDDEN"
	// BadRequest (400): a malformed parameter or body (a limit, a
	// cursor, a state, an id, a missing or refused reason); nothing done.
	BadRequest = "BAD_REQUEST"
	// NotFound (404): no such path or action, or nothing to act on (no open dead
	// letter of that id; an instruction that is not pending).
	NotFound = "NOT_FOUND"
	// NotPaused (404): a resume of a rail that was not paused.
	NotPaused = "NOT_PAUSED"
	// BodyTooLarge (413): a body said to be larger than MaxRequestBody.
	BodyTooLarge = "BODY_TOO_LARGE"
	// TooManyFailures (429): the source sent too many wrong secrets
	// (AuthFailureLimit); its secret was not checked. Retry-After says
	// when it may try again.
	TooManyFailures = "TOO_MANY_FAILURES"
	// MethodNotAllowed (405): the path does not take this method; Allow
	// says which it takes.
	MethodNotAllowed = "METHOD_NOT_ALLOWED"
	// SchemaBehind (503): the database's schema is older than this
	// build: a function the action needs is not there; nothing done.
	// Run outbox migrate.
	SchemaBehind = "SCHEMA_BEHIND"
	// Internal (500): the request failed; the process logged why.
	Internal = "INTERNAL"
)

// errorBody is the body of an error answer without a result: its code
// and what happened in words.
type errorBody map[string]string

// writeError answers status with {"code": code, "error": msg} and the
// extra fields given as key, value pairs (a verify's who and since):
// every error answer of the API that has no result to carry.
func writeError(w http.ResponseWriter, status int, code, msg string, fields ...string) {
	body := errorBody{"code": code, "error": msg}
	for i := 0; i+1 < len(fields); i += 2 {
		body[fields[i]] = fields[i+1]
	}
	writeJSON(w, status, body)
}

// coded is a result that an error answer carries whole (ActionResult,
// PauseResult), with its code.
type coded interface{ setCode(code string) }

// writeResult answers status with the result v, its "code" set to code:
// the error answers of the actions, whose "error" (the code, where the
// result had one) stays as it was.
func writeResult(w http.ResponseWriter, status int, code string, v coded) {
	v.setCode(code)
	writeJSON(w, status, v)
}
