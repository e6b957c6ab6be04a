//go:build !wasip1

// Package wasmtest loads a filter of this module, compiled to a wasip1 reactor, into the
// proxy-wasm host's offline harness, for the filters' tests in wazero.
package wasmtest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/harness"
	"github.com/wasmesh/wasmesh/wasm/wasmbuild"
)

// Build compiles the filter in dir (cached by source content) and returns the artifact.
func Build(tb testing.TB, dir string) wasmbuild.Artifact {
	tb.Helper()
	art, err := wasmbuild.Build(context.Background(), dir, wasmbuild.Options{})
	require.NoError(tb, err)
	return art
}

// Bytes is Build's module.
func Bytes(tb testing.TB, dir string) []byte {
	tb.Helper()
	b, err := Build(tb, dir).Bytes()
	require.NoError(tb, err)
	return b
}

// Harness loads the filter in dir with opts (Wasm is filled in), closed when tb ends.
func Harness(tb testing.TB, dir string, opts harness.Options) *harness.Harness {
	tb.Helper()
	opts.Wasm = Bytes(tb, dir)
	return harness.NewT(tb, opts)
}
