package store

// GenericPlansSQL and ClaimPlansSQL are what the store runs before its hot
// statements in each batch, for tests of what they set.
const (
	GenericPlansSQL = genericPlansSQL
	ClaimPlansSQL   = claimPlansSQL
	NoJITSQL        = noJITSQL
)

// QueryNoJIT is queryNoJIT, for tests of what it plans with.
var QueryNoJIT = queryNoJIT

// BeginVerify is beginVerify, for tests of the snapshot a verify's
// workers share.
var BeginVerify = beginVerify

// WithCheckpointBatch returns a copy of s whose verify and export read n
// checkpoints at a time.
func WithCheckpointBatch(s *Store, n int) *Store {
	c := *s
	c.checkpointBatch = n
	return &c
}

// WithNotThere returns a copy of s that runs f after a look that found no
// dead letter and before the look in flight that follows it.
func WithNotThere(s *Store, f func()) *Store {
	c := *s
	c.notThere = f
	return &c
}

// RefusedInput is refusedInput, for tests of how the database's refusals
// of an operator action's input read in Go.
var RefusedInput = refusedInput
