package rails_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaks goroutines (a transport or breaker
// that outlives its caller).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
