//go:build race

package test

// raceBuild: the test binary runs with the race detector, so the outbox
// binary is built with it too and races in relayers under faults fail the
// suite (see proc.checkLogClean).
const raceBuild = true
