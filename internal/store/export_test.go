package store

// GenericPlansSQL and ClaimPlansSQL are what the store runs before its hot
// statements in each batch, for tests of what they set.
const (
	GenericPlansSQL = genericPlansSQL
	ClaimPlansSQL   = claimPlansSQL
)
