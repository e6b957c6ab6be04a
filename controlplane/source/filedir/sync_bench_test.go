package filedir

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkSyncOneChangedFile is what a change to one small file costs in a directory of
// 3000 configs in 40 files: read=walk reads the whole directory (unchanged files compared
// in place), read=paths only the file the watcher named (SyncPaths, as Run does); both
// update what is in force (each change replaces one config with another).
func BenchmarkSyncOneChangedFile(b *testing.B) {
	for _, mode := range []string{"walk", "paths"} {
		b.Run("read="+mode, func(b *testing.B) {
			dir := b.TempDir()
			for f := range 40 {
				var part strings.Builder
				for i := f * 75; i < (f+1)*75; i++ {
					part.WriteString("---\n" + se("svc-"+strconv.Itoa(i), 80))
				}
				write(b, filepath.Join(dir, "services-"+strconv.Itoa(f)+".yaml"), part.String())
			}
			s := newSource(dir)
			require.NoError(b, s.Sync())
			extra := filepath.Join(dir, "extra.yaml")
			b.ResetTimer()
			for i := range b.N {
				write(b, extra, se("extra-"+strconv.Itoa(i), 80))
				if mode == "walk" {
					require.NoError(b, s.Sync())
				} else {
					require.NoError(b, s.SyncPaths(map[string]struct{}{extra: {}}))
				}
			}
			b.StopTimer()
			require.Len(b, s.List(), 3001)
		})
	}
}
