package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// `make run` end to end: meshrun starts the sample mesh and reports the first successful
// request; Ctrl-C stops it with no failed request and no process left behind.
func TestMeshrunStartsAndStopsCleanly(t *testing.T) {
	bin, wasmDir := meshtest.Binaries(t)
	if _, err := os.Stat(filepath.Join(bin, "meshrun")); err != nil {
		t.Fatalf("meshrun missing in %s beside the other binaries: %v", bin, err)
	}
	root := meshtest.Root()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "meshrun"), "--dir", dir, "--bin", bin, "--wasm", wasmDir,
		"--config", filepath.Join(root, "testenv", "samples", "bookinfo"), "--interval", "500ms", "--rate", "50")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()

	lines := make(chan string, 1000)
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	var all strings.Builder
	wait := func(substr string) {
		t.Helper()
		deadline := time.After(2 * time.Minute)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("meshrun ended before %q:\n%s", substr, all.String())
				}
				all.WriteString(l + "\n")
				if strings.Contains(l, substr) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q from meshrun:\n%s", substr, all.String())
			}
		}
	}
	wait("the mesh is up")
	wait("istio_requests_total{") // the live summary shows the telemetry filter's series
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	wait("stopped;")
	for l := range lines {
		all.WriteString(l + "\n")
	}
	require.NoError(t, cmd.Wait(), all.String())
	t.Log(all.String())
	assert.Contains(t, all.String(), "failed 0,")

	// Nothing started for this mesh is still running.
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	require.NoError(t, err)
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			t.Errorf("left behind: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
