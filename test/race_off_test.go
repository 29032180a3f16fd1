//go:build !race

package test

// raceBuild: see race_on_test.go.
const raceBuild = false
