package store

// GenericPlansSQL is what the store runs before its hot statements in each
// batch, for tests of what it sets.
const GenericPlansSQL = genericPlansSQL
