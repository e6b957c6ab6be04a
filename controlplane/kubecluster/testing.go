package kubecluster

import (
	"context"
	"os"
	"testing"
	"time"
)

// RequireBinaries skips the test when the binaries are not built (a plain `go test`), and
// fails it instead under `make test` (WASMESH_REQUIRE_FIXTURES), so CI never skips.
func RequireBinaries(tb testing.TB) {
	tb.Helper()
	if _, err := BinDir(); err != nil {
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			tb.Fatal(err)
		}
		tb.Skip(err)
	}
}

// ForTest starts a cluster for a test (RequireBinaries first), with the Istio CRDs of the
// kinds named, stopped when the test ends.
func ForTest(tb testing.TB, opts Options, crdKinds ...string) *Cluster {
	tb.Helper()
	RequireBinaries(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	if len(crdKinds) > 0 {
		if err := c.InstallIstioCRDs(ctx, crdKinds...); err != nil {
			tb.Fatal(err)
		}
	}
	return c
}
