package statsplan

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
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
// the encoded name) or the error it is refused with. Only a case named error-* may be
// refused, and it must be: that is checked before -update writes anything, so a good
// configuration that starts failing fails its case instead of becoming its golden.
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
			pl, err := Load(input, goldenNode)
			if strings.HasPrefix(filepath.Base(dir), "error-") {
				require.Error(t, err, "an error-* case must be refused")
				got = "error: " + err.Error() + "\n"
			} else {
				require.NoError(t, err, "only error-* cases may be refused")
				got = pl.Describe()
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
