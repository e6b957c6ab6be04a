package wasmbuild

import (
	"os"
	"testing"
)

// RequireFixturesEnv, set to 1 (as `make test` does), turns a missing prebuilt artifact
// into a test failure instead of a skip.
const RequireFixturesEnv = "WASMESH_REQUIRE_FIXTURES"

// Prebuilt returns the bytes of an artifact the Makefile builds outside the Go toolchain
// (such as the AssemblyScript fixture), found at the path held by the environment variable
// env. When the variable is unset or the file is missing the test is skipped with a message
// naming the make target that builds it, or fails when RequireFixturesEnv is set.
func Prebuilt(tb testing.TB, env, target string) []byte {
	tb.Helper()
	path := os.Getenv(env)
	if path == "" {
		missing(tb, "%s is not set: run `make %s` (or `make test`, which sets it)", env, target)
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		missing(tb, "%s=%s: %v: run `make %s`", env, path, err, target)
		return nil
	}
	return b
}

func missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv(RequireFixturesEnv) == "1" {
		tb.Fatalf(format, args...)
	}
	tb.Skipf(format, args...)
}
