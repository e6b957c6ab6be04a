package localmesh

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/echo"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

var twoServices = meshtest.ServiceEntry("frontend", 9080, 8080) + "---\n" + meshtest.ServiceEntry("backend", 9081, 8081)

// Two pods talk through their sidecars: over mutual TLS by default (the backend's sidecar
// forwards the caller's identity in x-forwarded-client-cert), in plaintext with
// Options.Plaintext.
func TestTwoPodsTalkThroughTheirSidecars(t *testing.T) {
	for _, plaintext := range []bool{false, true} {
		t.Run(map[bool]string{false: "mutual TLS", true: "plaintext"}[plaintext], func(t *testing.T) {
			twoPodsTalk(t, plaintext)
		})
	}
}

func twoPodsTalk(t *testing.T, plaintext bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bin, _ := meshtest.Binaries(t)
	m, err := Start(ctx, Options{BinDir: bin, Config: map[string]string{"services.yaml": twoServices}, Logf: t.Logf, Plaintext: plaintext})
	require.NoError(t, err)
	defer m.Close()

	backend, err := m.AddPod(ctx, PodSpec{Labels: map[string]string{"app": "backend"}, Port: 8081})
	require.NoError(t, err)
	frontend, err := m.AddPod(ctx, PodSpec{Labels: map[string]string{"app": "frontend"},
		Calls: []string{"http://backend.default.svc.cluster.local:9081/"}, HoldApplicationUntilProxyStarts: true})
	require.NoError(t, err)

	var a echo.Answer
	require.Eventually(t, func() bool {
		resp, err := http.Get(frontend.URL("/"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && json.Unmarshal(b, &a) == nil
	}, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, "frontend", a.Service)
	require.Len(t, a.Upstream, 1)
	require.NotNil(t, a.Upstream[0].Answer)
	assert.Equal(t, backend.Spec.Name, a.Upstream[0].Answer.Pod)
	xfcc := a.Upstream[0].Answer.Headers["x-forwarded-client-cert"]
	if plaintext {
		assert.Empty(t, xfcc, "a plaintext hop carries no client certificate")
	} else {
		assert.Contains(t, xfcc, "URI=spiffe://cluster.local/ns/default/sa/default", "the backend's sidecar saw the frontend's certificate")
	}

	// Every process ends with Close.
	m.Close()
	for _, p := range m.Pods() {
		assert.False(t, p.Running(), p.Spec.Name)
	}
}

// A port picked free can be taken before discovery binds it (by an outgoing connection's
// source port, or another mesh): the mesh then starts discovery again on other ports.
func TestDiscoveryStartsAgainWhenItsPortWasTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bin, _ := meshtest.Binaries(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	calls := 0
	pickPort = func(ip string) (int, error) {
		if calls++; calls == 1 {
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return freePort(ip)
	}
	defer func() { pickPort = freePort }()

	m, err := Start(ctx, Options{BinDir: bin, Config: map[string]string{"services.yaml": twoServices}, Logf: t.Logf})
	require.NoError(t, err)
	defer m.Close()
	assert.NotEqual(t, taken.Addr().String(), m.DiscoveryAddress())
	assert.Equal(t, 4, calls, "two ports picked twice")
}
