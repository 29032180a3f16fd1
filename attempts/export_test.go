package attempts

// RecordSQL exposes the outcome statement to plan tests.
var RecordSQL = recordSQL
