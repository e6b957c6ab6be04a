package sidecar_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/agent/internal/proxytest"
	"github.com/wasmesh/wasmesh/agent/internal/testca"
	"github.com/wasmesh/wasmesh/agent/sidecar"
)

// xdsOptions is a pod whose agent runs the XDS proxy to disc (TLS, mesh root of ca, the
// pod's CA credential), with its sockets at short paths.
func xdsOptions(t *testing.T, ca *testca.CA, disc *proxytest.Discovery) (sidecar.Options, *running) {
	token := ca.Allow(t, "web-token", "cluster.local", "shop", "web")
	o, r := options(t, pod{env: []string{"WASMESH_XDS_PLAINTEXT=false",
		`PROXY_CONFIG={"discoveryAddress":"` + disc.Addr() + `","terminationDrainDuration":"0s"}`,
		sidecar.TokenFileEnv + "=" + token, "CA_ADDR=" + ca.Addr, "CA_ROOT_CA=" + ca.RootFile}})
	dir, err := os.MkdirTemp("", "xds") // a socket path has at most 107 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	o.SDSSocket, o.XDSSocket = filepath.Join(dir, "sds"), filepath.Join(dir, "XDS")
	o.CredentialsDir = filepath.Join(r.dir, "credentials")
	return o, r
}

// meshproxy gets its configuration through the agent's XDS proxy: the bootstrap's
// xds-grpc cluster is a pipe to the agent's socket, and discovery sees the pod's
// credential on every stream, the proxy's and the agent's health reports alike.
func TestProxyConfiguredThroughTheXDSProxy(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	disc := proxytest.StartSecureDiscovery(t, ca.ServingCert(t), ca.Roots())
	o, r := xdsOptions(t, ca, disc)
	r.run(t, o)

	require.Eventually(t, r.readyIs(503, "INITIALIZING"), 10*time.Second, 20*time.Millisecond,
		"connected through the XDS proxy, waiting for a first configuration")
	disc.Configure(proxytest.Config{})
	require.Eventually(t, r.readyIs(200, ""), 10*time.Second, 20*time.Millisecond)

	bootstrap, err := os.ReadFile(filepath.Join(o.ConfigPath, "envoy-rev0.json"))
	require.NoError(t, err)
	assert.Contains(t, string(bootstrap), `"path": "`+o.XDSSocket+`"`, "xds-grpc is a pipe to the XDS proxy")
	assert.NotContains(t, string(bootstrap), `"port_value": `+strings.Split(disc.Addr(), ":")[1])

	_, node := disc.Reports()
	assert.Equal(t, r.agent.Params().NodeID, node, "the proxy's node reached discovery")
	callers := disc.Callers()
	require.GreaterOrEqual(t, len(callers), 2, "the proxy's stream and the health reports")
	for _, c := range callers {
		assert.Equal(t, "Bearer web-token", c.Authorization)
	}
}

// A discovery whose certificate the mesh root does not sign is refused, and the pod's
// readiness says so.
func TestXDSProxyRefusesAForeignDiscovery(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	foreign := testca.Start(t, time.Hour)
	disc := proxytest.StartSecureDiscovery(t, foreign.ServingCert(t), foreign.Roots())
	disc.Configure(proxytest.Config{})
	o, r := xdsOptions(t, ca, disc)
	r.run(t, o)

	require.Eventually(t, r.readyIs(503, "not trusted by "+ca.RootFile), 10*time.Second, 20*time.Millisecond)
	assert.Empty(t, disc.Callers(), "no stream reached the foreign discovery")
}

// An XDS proxy socket another agent serves (two agents in one working directory) stops the
// agent at once, naming the flag, instead of taking over the other agent's proxy.
func TestXDSSocketInUseStopsTheAgent(t *testing.T) {
	ca := testca.Start(t, time.Hour)
	disc := proxytest.StartSecureDiscovery(t, ca.ServingCert(t), ca.Roots())
	o, _ := xdsOptions(t, ca, disc)
	other, err := net.Listen("unix", o.XDSSocket)
	require.NoError(t, err)
	defer other.Close()
	go func() {
		for {
			c, err := other.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	a, err := sidecar.New(o)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--xdsSocket: XDS proxy socket "+o.XDSSocket+" is in use by another process")
	case <-time.After(15 * time.Second):
		t.Fatal("the agent neither served nor stopped")
	}
}
