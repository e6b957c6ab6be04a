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
			require.Len(b, list(s), 3001)
		})
	}
}

// BenchmarkSyncNewFile is a new small file in a directory shaped as the push benchmark's:
// one file of 3000 configs and 300 small files of two (the file's write is not timed).
func BenchmarkSyncNewFile(b *testing.B) {
	dir := b.TempDir()
	var big strings.Builder
	for i := range 3000 {
		big.WriteString("---\n" + se("svc-"+strconv.Itoa(i), 80))
	}
	write(b, filepath.Join(dir, "services.yaml"), big.String())
	for f := range 300 {
		write(b, filepath.Join(dir, "small-"+strconv.Itoa(f)+".yaml"), se("small-"+strconv.Itoa(f), 80)+"---\n"+se("small-b-"+strconv.Itoa(f), 81))
	}
	s := newSource(dir)
	require.NoError(b, s.Sync())
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		extra := filepath.Join(dir, "extra-"+strconv.Itoa(i)+".yaml")
		write(b, extra, se("extra-"+strconv.Itoa(i), 80)+"---\n"+se("extra-b-"+strconv.Itoa(i), 81))
		b.StartTimer()
		require.NoError(b, s.SyncPaths(map[string]struct{}{extra: {}}))
	}
	b.StopTimer()
	require.Len(b, list(s), 3600+2*b.N)
}
