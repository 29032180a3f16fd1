package strictjson

// MaxIntDigits and MaxScale are maxIntDigits and maxScale, for the test
// against PostgreSQL, which runs outside the package (its database
// harness imports packages that import this one).
const (
	MaxIntDigits = maxIntDigits
	MaxScale     = maxScale
)
