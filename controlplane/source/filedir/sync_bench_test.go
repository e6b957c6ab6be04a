package filedir

import (
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/metrics"
)

// BenchmarkSyncOneChangedFile is what a change to one small file costs in a directory of
// 3000 configs: the read of the whole directory (unchanged files compared in place) and the
// update of what is in force (each change replaces one config with another).
func BenchmarkSyncOneChangedFile(b *testing.B) {
	dir := b.TempDir()
	var big strings.Builder
	for i := range 3000 {
		if i > 0 {
			big.WriteString("---\n")
		}
		big.WriteString(se("svc-"+strconv.Itoa(i), 80))
	}
	write(b, filepath.Join(dir, "services.yaml"), big.String())
	s := New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.New(prometheus.NewRegistry()))
	require.NoError(b, s.Sync())
	b.ResetTimer()
	for i := range b.N {
		write(b, filepath.Join(dir, "extra.yaml"), se("extra-"+strconv.Itoa(i), 80))
		require.NoError(b, s.Sync())
	}
	b.StopTimer()
	require.Len(b, s.List(), 3001)
}
