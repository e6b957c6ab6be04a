package adsc_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/discovery/discoverytest"
	"github.com/wasmesh/wasmesh/controlplane/server"
)

const (
	frontendYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: frontend, namespace: demo}
spec:
  hosts: [frontend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http}]
  endpoints: [{address: 127.10.0.1}]
`
	backendYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9081, name: http}]
  endpoints: [{address: 127.10.0.2}]
`
	frontendCluster = "outbound|9080||frontend.demo.svc.cluster.local"
	backendCluster  = "outbound|9081||backend.demo.svc.cluster.local"
	proxyID         = "sidecar~127.10.1.1~client-1.demo~demo.svc.cluster.local"
)

// mesh is a control plane serving two services, and the client's gRPC connection to it.
type mesh struct {
	t   *testing.T
	dir string
	d   *discovery.Discovery
	cc  *grpc.ClientConn
}

// newMesh is the one place that knows how the server is built.
func newMesh(t *testing.T) *mesh {
	t.Helper()
	m := &mesh{t: t, dir: t.TempDir()}
	m.writeFile("frontend.yaml", frontendYAML)
	m.writeFile("backend.yaml", backendYAML)
	opts := discovery.Options{ConfigDir: m.dir, GRPCAddr: "127.0.0.1:0", Server: server.Defaults(),
		ShutdownGrace: time.Second, WasmCacheDir: t.TempDir()}
	opts.Debounce = discoverytest.Debounce
	opts.Server.ReconnectWindow = 0
	srv := discoverytest.Run(t, opts, discoverytest.Log())
	m.d, m.cc = srv.Discovery, srv.Dial()
	return m
}

func (m *mesh) writeFile(name, data string) {
	require.NoError(m.t, os.WriteFile(filepath.Join(m.dir, name), []byte(data), 0o644))
}

// write changes a config file and has discovery read it.
func (m *mesh) write(name, data string) {
	m.writeFile(name, data)
	require.NoError(m.t, m.d.Configs.Sync())
}

func (m *mesh) remove(name string) {
	require.NoError(m.t, os.Remove(filepath.Join(m.dir, name)))
	require.NoError(m.t, m.d.Configs.Sync())
}

// dial starts a client for the test proxy; it stops with the test.
func (m *mesh) dial(cfg adsc.Config) *adsc.Client {
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "INTERCEPTION_MODE": "NONE", "WASMESH_LOCALHOST": "127.20.1.1"})
	require.NoError(m.t, err)
	cfg.Node = &core.Node{Id: proxyID, Metadata: md}
	ctx, cancel := context.WithCancel(context.Background())
	m.t.Cleanup(cancel)
	c, err := adsc.Dial(ctx, m.cc, cfg)
	require.NoError(m.t, err)
	return c
}

// waitStatus waits until the server's /debug/syncz state of the test proxy satisfies cond.
func (m *mesh) waitStatus(what string, cond func(map[string]server.TypeStatus) bool) map[string]server.TypeStatus {
	m.t.Helper()
	var st map[string]server.TypeStatus
	ok := assert.Eventually(m.t, func() bool { st = m.status(); return cond(st) }, 10*time.Second, 2*time.Millisecond)
	if !ok {
		m.t.Fatalf("the server never showed %s; it shows %+v", what, m.status())
	}
	return st
}

// synced reports whether the proxy has ACKed the last response of every type in types.
func synced(types ...string) func(map[string]server.TypeStatus) bool {
	return func(st map[string]server.TypeStatus) bool {
		for _, typ := range types {
			s, ok := st[typ]
			if !ok || s.Sent == 0 || s.NonceAcked != s.NonceSent || s.VersionAcked != s.VersionSent {
				return false
			}
		}
		return true
	}
}

// status is the server's sync state of the test proxy, by short type.
func (m *mesh) status() map[string]server.TypeStatus {
	out := map[string]server.TypeStatus{}
	if c := m.d.Server.Connection(proxyID); c != nil {
		for _, s := range c.SyncStatus() {
			out[s.Type] = s
		}
	}
	return out
}

func wait(t *testing.T, c *adsc.Client, what string, cond func(*adsc.Client) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Wait(ctx, cond), what)
}

func forBoth(t *testing.T, f func(t *testing.T, delta bool)) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) { f(t, delta) })
	}
}

// The client subscribes as Envoy does (CDS and LDS, then EDS for the EDS clusters and RDS
// for the routes the listeners name) and ACKs every response: the server records each
// type's last response as accepted, and the subscriptions it holds are the client's.
func TestClientSubscribesAndAcksAsEnvoy(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		c := m.dial(adsc.Config{Delta: delta})
		wait(t, c, "routes", func(c *adsc.Client) bool { return c.Count(adsc.RouteType) == 2 })
		st := m.waitStatus("every type ACKed", synced("cds", "eds", "lds", "rds"))
		assert.Equal(t, c.Subscribed(adsc.EndpointType), st["eds"].Subscribed)
		assert.Equal(t, c.Subscribed(adsc.RouteType), st["rds"].Subscribed)
		assert.Equal(t, []string{frontendCluster, backendCluster}, c.Names(adsc.EndpointType))
		assert.Equal(t, []string{"9080", "9081"}, c.Names(adsc.RouteType))
		for _, typ := range []string{"cds", "eds", "lds", "rds"} {
			assert.Zero(t, st[typ].Nacks, typ)
			assert.Equal(t, st[typ].Sent, st[typ].Acks, "%s: every response ACKed once", typ)
		}
		for _, r := range c.Responses() {
			assert.False(t, r.Nacked)
			assert.False(t, r.Acked.IsZero(), "%s %s", r.TypeURL, r.Nonce)
		}
	})
}

// A response the client's Reject refuses goes back as a NACK with its nonce: the server
// records the rejection and keeps the version accepted before; the client keeps what it
// had; the next response it accepts is recorded as accepted.
func TestClientNackIsRecordedByTheServer(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		const reason = "listener 127.20.1.1_9082: bind: address already in use"
		c := m.dial(adsc.Config{Delta: delta, Reject: func(typ string, names []string) string {
			for _, n := range names {
				if typ == adsc.ListenerType && n == "127.20.1.1_9082" {
					return reason
				}
			}
			return ""
		}})
		wait(t, c, "routes", func(c *adsc.Client) bool { return c.Count(adsc.RouteType) == 2 })
		before := m.waitStatus("every type ACKed", synced("cds", "eds", "lds", "rds"))["lds"]

		m.write("extra.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec: {hosts: [extra.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9082, name: http}], endpoints: [{address: 127.10.9.9}]}
`)
		lds := m.waitStatus("the LDS NACK", func(st map[string]server.TypeStatus) bool { return st["lds"].Nacks > 0 })["lds"]
		assert.Equal(t, 1, lds.Nacks)
		assert.Equal(t, reason, lds.NackError)
		assert.Equal(t, lds.VersionSent, lds.VersionNacked)
		assert.Equal(t, before.VersionAcked, lds.VersionAcked, "the accepted version stays the one before")
		assert.Equal(t, before.NonceAcked, lds.NonceAcked)
		assert.Equal(t, before.Acks, lds.Acks)
		assert.Equal(t, []string{"127.20.1.1_9080", "127.20.1.1_9081"}, c.Names(adsc.ListenerType), "the client keeps its listeners")
		var l listener.Listener
		assert.True(t, c.Resource(adsc.ListenerType, "127.20.1.1_9081", &l))
		nacked := 0
		for _, r := range c.Responses() {
			if r.Nacked {
				nacked++
				assert.Equal(t, adsc.ListenerType, r.TypeURL)
			}
		}
		assert.Equal(t, 1, nacked)

		// The change is taken back: the listeners are accepted again.
		m.remove("extra.yaml")
		lds = m.waitStatus("the listeners accepted again", synced("cds", "lds"))["lds"]
		assert.Equal(t, before.Acks+1, lds.Acks)
		assert.Equal(t, 1, lds.Nacks)
	})
}

// The client follows CDS with its EDS subscription: a cluster that comes is subscribed, one
// that goes is dropped, as the server's subscription count shows.
func TestClientFollowsClustersWithEDS(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		c := m.dial(adsc.Config{Delta: delta})
		subscribed := func(n int) func(map[string]server.TypeStatus) bool {
			return func(st map[string]server.TypeStatus) bool {
				return st["eds"].Subscribed == n && synced("cds", "eds")(st)
			}
		}
		m.waitStatus("2 clusters' endpoints subscribed", subscribed(2))
		m.remove("backend.yaml")
		m.waitStatus("the backend's endpoints dropped", subscribed(1))
		assert.Equal(t, []string{frontendCluster}, c.Names(adsc.EndpointType))
		m.write("backend.yaml", backendYAML)
		m.waitStatus("the backend's endpoints subscribed again", subscribed(2))
		wait(t, c, "backend endpoints", func(c *adsc.Client) bool { return c.Has(adsc.EndpointType, backendCluster) })
	})
}

// A client whose stream the server ends reports why, and Wait stops waiting.
func TestClientReportsTheEndOfItsStream(t *testing.T) {
	m := newMesh(t)
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	require.NoError(t, err)
	c, err := adsc.Dial(context.Background(), m.cc, adsc.Config{Node: &core.Node{Id: "not-a-node-id", Metadata: md}})
	require.NoError(t, err)
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("stream not ended")
	}
	require.Error(t, c.Err())
	assert.Contains(t, c.Err().Error(), "want 4 parts")
	err = c.Wait(context.Background(), func(*adsc.Client) bool { return false })
	assert.ErrorContains(t, err, "stream ended")
	assert.Nil(t, m.d.Server.Connection("not-a-node-id"))
}
