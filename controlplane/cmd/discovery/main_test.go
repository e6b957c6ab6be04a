package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// binary is bin/discovery, which make test builds first; otherwise it is built here.
func binary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(os.Getenv("WASMESH_BIN_DIR"), "discovery")
	if _, err := os.Stat(bin); os.Getenv("WASMESH_BIN_DIR") == "" || err != nil {
		bin = filepath.Join(t.TempDir(), "discovery")
		out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
		require.NoError(t, err, string(out))
	}
	return bin
}

// TestBinaryServesAndShutsDownGracefully runs the real binary: flags, environment, config
// directory, xDS, debug HTTP, and SIGTERM.
func TestBinaryServesAndShutsDownGracefully(t *testing.T) {
	bin := binary(t)

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec: {hosts: [backend.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9081, name: http, targetPort: 8081}], endpoints: [{address: 127.10.0.2}]}
`), 0o644))
	grpcAddr, httpAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "--configDir", dir, "--grpcAddr", grpcAddr, "--httpAddr", httpAddr, "--log_output_level", "default:warn")
	cmd.Env = append(os.Environ(), "PILOT_DEBOUNCE_AFTER=10ms", "PILOT_PUSH_THROTTLE=10")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()

	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := adsc.Dial(ctx, cc, adsc.Config{Node: &core.Node{Id: "sidecar~127.10.0.1~client.demo~demo.svc.cluster.local"}})
	require.NoError(t, err)
	require.NoError(t, c.Wait(ctx, func(c *adsc.Client) bool { return len(c.Names(adsc.EndpointType)) == 1 }))
	assert.Equal(t, []string{"outbound|9081||backend.demo.svc.cluster.local"}, c.Names(adsc.EndpointType))

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		require.NoError(t, err, "discovery should exit 0 on SIGTERM")
	case <-time.After(20 * time.Second):
		t.Fatal("discovery did not stop after SIGTERM")
	}
	<-c.Done() // the stream was closed by the server
}

func TestBadEnvironmentIsAnError(t *testing.T) {
	t.Setenv("PILOT_PUSH_THROTTLE", "many")
	cmd := newCommand()
	cmd.SetArgs([]string{"--grpcAddr", "127.0.0.1:0", "--httpAddr", ""})
	cmd.SetOut(new(nopWriter))
	cmd.SetErr(new(nopWriter))
	err := cmd.Execute()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PILOT_PUSH_THROTTLE")
}

// Plaintext xDS on every interface, or on any address that is not loopback, is refused at
// start, naming the flag; the default serves none.
func TestPlaintextXDSOnlyOnLoopback(t *testing.T) {
	for _, addr := range []string{":15010", "0.0.0.0:0", "192.0.2.2:0"} {
		cmd := newCommand()
		cmd.SetArgs([]string{"--grpcAddr", addr, "--httpAddr", ""})
		cmd.SetOut(new(nopWriter))
		cmd.SetErr(new(nopWriter))
		err := cmd.Execute()
		require.Error(t, err, addr)
		assert.Contains(t, err.Error(), `grpcAddr "`+addr+`": plaintext xDS is unauthenticated and served only on an explicit loopback address`)
	}
	assert.Empty(t, newCommand().Flags().Lookup("grpcAddr").DefValue, "no plaintext xDS unless asked for")
}

type nopWriter struct{}

func (*nopWriter) Write(b []byte) (int, error) { return len(b), nil }

// TestConfigDirThatIsNotADirectoryIsRefused: a file or a missing path as --configDir would
// serve an empty mesh without a word; the command refuses it, naming the path and why.
func TestConfigDirThatIsNotADirectoryIsRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mesh.yaml")
	require.NoError(t, os.WriteFile(file, []byte("kind: ServiceEntry\n"), 0o644))
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct{ name, dir, want string }{
		{"file", file, "configDir " + file + ": not a directory (give the directory that holds the Istio YAML files)"},
		{"missing", missing, "configDir " + missing + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			cmd := newCommand()
			cmd.SetArgs([]string{"--configDir", tc.dir, "--grpcAddr", "127.0.0.1:0", "--httpAddr", "", "--wasmCacheDir", t.TempDir()})
			cmd.SetOut(new(nopWriter))
			cmd.SetErr(&stderr)
			// Refused, it returns at once; were it not, it would serve until the deadline.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
			assert.Contains(t, stderr.String(), "Error: "+tc.want)
		})
	}
}

// TestStartLogSaysWhatItServes: the first lines say where the mesh comes from: the config
// directory (absolute) and how many configs it held, or loudly that there is none.
func TestStartLogSaysWhatItServes(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "svc.yaml"), []byte(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec: {hosts: [backend.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9081, name: http}]}
`), 0o644))
	// A relative --configDir is reported as the absolute path it is.
	wd, err := os.Getwd()
	require.NoError(t, err)
	rel, err := filepath.Rel(wd, dir)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"configDir", []string{"--configDir", rel},
			`level=INFO msg="serving config" configDir=` + dir + ` configs=1 documentsRejected=0 meshConfig="Istio defaults"`},
		{"none", nil, `level=WARN msg="no configDir: serving no Istio config, so the mesh has no services;`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			cmd := newCommand()
			cmd.SetArgs(append(tc.args, "--grpcAddr", "127.0.0.1:0", "--httpAddr", "", "--wasmCacheDir", t.TempDir()))
			cmd.SetOut(new(nopWriter))
			cmd.SetErr(&stderr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- cmd.ExecuteContext(ctx) }()
			require.Eventually(t, func() bool { return strings.Contains(stderr.String(), `msg="discovery serving"`) },
				20*time.Second, 10*time.Millisecond, "%s", &stderr)
			assert.Contains(t, stderr.String(), tc.want)
			cancel()
			require.NoError(t, <-done)
		})
	}
}

// syncBuffer is a bytes.Buffer the command writes to while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
