package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/*/output.golden")

// goldenNode is the node the golden cases are planned against.
func goldenNode(path []string) ([]byte, bool) {
	if len(path) == 3 && path[0] == "node" && path[1] == "metadata" && path[2] == "MESH_ID" {
		return []byte("cluster.local"), true
	}
	return nil, false
}

// TestGoldenPlans records, for each testdata/<case>/input.json plugin configuration, the
// metrics it reports (name, type, value, tags in order and where each tag comes from,
// the encoded name) or the error it is refused with.
func TestGoldenPlans(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("testdata", "*", "input.json"))
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	for _, in := range dirs {
		dir := filepath.Dir(in)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			input, err := os.ReadFile(filepath.Join(dir, "input.json"))
			require.NoError(t, err)
			var got string
			if pl, err := loadPlan(input, goldenNode); err != nil {
				got = "error: " + err.Error() + "\n"
			} else {
				got = pl.describe()
			}
			golden := filepath.Join(dir, "output.golden")
			if *update {
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test -update to create it")
			assert.Equal(t, string(want), got)
		})
	}
}
