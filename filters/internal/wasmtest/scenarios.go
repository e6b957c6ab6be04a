//go:build !wasip1

package wasmtest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/wasm/filtertest"
)

// Scenarios runs every filtertest scenario in dir/testdata/*.yaml against the filter in dir,
// freshly built, so the scenarios users run with bin/filtertest keep passing.
func Scenarios(t *testing.T, dir string) {
	t.Helper()
	art := Build(t, dir)
	files, err := filepath.Glob(filepath.Join(dir, "testdata", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no scenarios in %s/testdata", dir)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			s, err := filtertest.Load(f)
			require.NoError(t, err)
			s.Wasm = art.Path
			res := filtertest.Run(context.Background(), nil, s)
			var out strings.Builder
			res.Write(&out, true)
			t.Log(out.String())
			require.NoError(t, res.Err)
			assert.True(t, res.Passed())
		})
	}
}
