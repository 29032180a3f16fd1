package store

// The retry budget, in one place.
//
// A pending row's attempt_count is the number of its attempts that used up
// budget. A claim's attempt number is attempt_count + 1 (claimAttemptNo).
// When an attempt ends and the instruction goes back to pending, the count
// it goes back with is:
//
//   - its attempt number, if the attempt counted (the rail was called and
//     failed: a retry);
//   - its attempt number - 1, if it did not (the breaker was open, the
//     relayer was stopping, the rail is not configured: see the engine's
//     retry policy; and a zombie the reaper requeued: the next claim gets
//     the same number again);
//   - 0 when an operator replays a dead letter (a fresh budget).
//
// The relayer's retry policy dead-letters the attempt whose number reaches
// its MaxAttempts ([LastAttempt]).

// claimAttemptNo is the attempt number of a claim of pending row p.
const claimAttemptNo = `p.attempt_count + 1`

// countAfter is the attempt_count an attempt numbered attemptNo leaves
// behind; counts is a boolean SQL expression: did the attempt count.
func countAfter(attemptNo, counts string) string {
	return `CASE WHEN ` + counts + ` THEN ` + attemptNo + ` ELSE ` + attemptNo + ` - 1 END`
}

// A replayed dead letter starts with attempt_count 0: a fresh budget (the
// replay_dead_letter function, migration 008).

// LastAttempt reports whether a failed attempt numbered attemptNo that
// counts against the budget was the last one allowed.
func LastAttempt(attemptNo, maxAttempts int) bool { return attemptNo >= maxAttempts }
