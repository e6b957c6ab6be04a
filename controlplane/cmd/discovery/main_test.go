package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// TestBinaryServesAndShutsDownGracefully runs the real binary: flags, environment, config
// directory, xDS, debug HTTP, and SIGTERM.
func TestBinaryServesAndShutsDownGracefully(t *testing.T) {
	// make test builds bin/discovery first; otherwise build it here.
	bin := filepath.Join(os.Getenv("WASMESH_BIN_DIR"), "discovery")
	if _, err := os.Stat(bin); os.Getenv("WASMESH_BIN_DIR") == "" || err != nil {
		bin = filepath.Join(t.TempDir(), "discovery")
		out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
		require.NoError(t, err, string(out))
	}

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

type nopWriter struct{}

func (*nopWriter) Write(b []byte) (int, error) { return len(b), nil }
