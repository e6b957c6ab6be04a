package discovery_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/discovery/discoverytest"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

const services = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: frontend, namespace: demo}
spec:
  hosts: [frontend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9080, name: http, targetPort: 8080}]
  workloadSelector: {labels: {app: frontend}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9081, name: http, targetPort: 8081}]
  workloadSelector: {labels: {app: backend}}
`

type env struct {
	t   *testing.T // nil in benchmarks
	dir string
	d   *discovery.Discovery
	cc  *grpc.ClientConn
}

func start(t testing.TB, files map[string]string, tune func(*discovery.Options)) *env {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644))
	}
	opts := discovery.Options{
		ConfigDir: dir, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Server: server.Defaults(), WorkloadGracePeriod: time.Hour, ShutdownGrace: time.Second,
	}
	opts.Debounce = discoverytest.Debounce
	if tune != nil {
		tune(&opts)
	}
	srv := discoverytest.Run(t, opts, discoverytest.Log())
	tt, _ := t.(*testing.T)
	return &env{t: tt, dir: dir, d: srv.Discovery, cc: srv.Dial()}
}

func (e *env) write(name, data string) {
	require.NoError(e.t, os.WriteFile(filepath.Join(e.dir, name), []byte(data), 0o644))
	// The watcher would see the write; syncing here makes the test independent of inotify timing.
	require.NoError(e.t, e.d.Configs.Sync())
}

func node(t *testing.T, name, app, ip, localhost string) *core.Node {
	md, err := structpb.NewStruct(map[string]any{
		"NAME": name, "NAMESPACE": "demo", "LABELS": map[string]any{"app": app}, "INSTANCE_IPS": ip,
		"INTERCEPTION_MODE": "NONE", "WASMESH_LOCALHOST": localhost,
	})
	require.NoError(t, err)
	return &core.Node{Id: fmt.Sprintf("sidecar~%s~%s.demo~demo.svc.cluster.local", ip, name), Metadata: md}
}

func (e *env) connect(cfg adsc.Config) *adsc.Client {
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	c, err := adsc.Dial(ctx, e.cc, cfg)
	require.NoError(e.t, err)
	return c
}

func wait(t *testing.T, c *adsc.Client, cond func(*adsc.Client) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Wait(ctx, cond))
}

func has(typ string, names ...string) func(*adsc.Client) bool {
	return func(c *adsc.Client) bool {
		got := map[string]bool{}
		for _, n := range c.Names(typ) {
			got[n] = true
		}
		for _, n := range names {
			if !got[n] {
				return false
			}
		}
		return true
	}
}

// hasEndpointIP reports whether the client's assignment for cluster has an endpoint at ip.
func hasEndpointIP(cluster, ip string) func(*adsc.Client) bool {
	return func(c *adsc.Client) bool {
		for _, a := range endpointsOf(c, cluster) {
			if strings.HasPrefix(a, ip+":") {
				return true
			}
		}
		return false
	}
}

func endpointsOf(c *adsc.Client, cluster string) []string {
	var cla endpoint.ClusterLoadAssignment
	if !c.Resource(adsc.EndpointType, cluster, &cla) {
		return nil
	}
	var out []string
	for _, l := range cla.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			a := e.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, fmt.Sprintf("%s:%d", a.GetAddress(), a.GetPortValue()))
		}
	}
	return out
}

func typesOf(rs []adsc.Response) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.TypeURL[strings.LastIndex(r.TypeURL, ".")+1:])
	}
	return out
}

const (
	frontendCluster = "outbound|9080||frontend.demo.svc.cluster.local"
	backendCluster  = "outbound|9081||backend.demo.svc.cluster.local"
)

func TestProxiesReceiveEveryTypeInOrderAndAck(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			e := start(t, map[string]string{"services.yaml": services}, nil)
			fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"), Delta: delta})
			be := e.connect(adsc.Config{Node: node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2"), Delta: delta})
			wait(t, fe, has(adsc.RouteType, "9080", "9081"))
			wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, backendCluster)) == 1 })
			wait(t, be, has(adsc.RouteType, "9080", "9081"))
			assert.Equal(t, []string{"127.10.0.2:8081"}, endpointsOf(fe, backendCluster))
			assert.Contains(t, fe.Names(adsc.ListenerType), "127.20.0.1_9081")
			assert.Contains(t, fe.Names(adsc.ListenerType), "127.10.0.1_8080")

			// The first responses come in Envoy's order: CDS, then EDS, then LDS, then RDS.
			seen := map[string]int{}
			for i, typ := range typesOf(fe.Responses()) {
				if _, ok := seen[typ]; !ok {
					seen[typ] = i
				}
			}
			assert.Less(t, seen["Cluster"], seen["ClusterLoadAssignment"])
			assert.Less(t, seen["ClusterLoadAssignment"], seen["RouteConfiguration"])
			assert.Less(t, seen["Listener"], seen["RouteConfiguration"])

			// The server saw an ACK for everything it sent.
			require.Eventually(t, func() bool {
				conn := e.d.Server.Connection("sidecar~127.10.0.1~frontend-1.demo~demo.svc.cluster.local")
				if conn == nil {
					return false
				}
				for _, st := range conn.SyncStatus() {
					if st.NonceSent != st.NonceAcked || st.Nacks != 0 {
						return false
					}
				}
				return len(conn.SyncStatus()) == 4
			}, 10*time.Second, 5*time.Millisecond)

			// A routes' virtual host per service with the short names for the namespace.
			var rc route.RouteConfiguration
			require.True(t, fe.Resource(adsc.RouteType, "9081", &rc))
			assert.Equal(t, "backend.demo.svc.cluster.local:9081", rc.GetVirtualHosts()[0].GetName())
			assert.Contains(t, rc.GetVirtualHosts()[0].GetDomains(), "backend:9081")
		})
	}
}

// A removed service leaves the proxy's EDS and RDS subscriptions: the client unsubscribes
// from the cluster's endpoints and the port's routes, and the server stops tracking them.
func TestRemovedServiceLeavesTheSubscriptions(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			e := start(t, map[string]string{"services.yaml": services}, nil)
			fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"), Delta: delta})
			wait(t, fe, has(adsc.RouteType, "9080", "9081"))
			wait(t, fe, has(adsc.EndpointType, frontendCluster, backendCluster))
			subscribed := func(typ string) int {
				conn := e.d.Server.Connection("sidecar~127.10.0.1~frontend-1.demo~demo.svc.cluster.local")
				for _, st := range conn.SyncStatus() {
					if st.Type == typ {
						return st.Subscribed
					}
				}
				return -1
			}
			edsBefore := subscribed("eds")
			require.Equal(t, edsBefore, fe.Subscribed(adsc.EndpointType))

			e.write("services.yaml", services[:strings.Index(services, "---")])
			wait(t, fe, func(c *adsc.Client) bool {
				return !c.Has(adsc.ClusterType, backendCluster) && !c.Has(adsc.EndpointType, backendCluster) && !c.Has(adsc.RouteType, "9081")
			})
			assert.Equal(t, edsBefore-1, fe.Subscribed(adsc.EndpointType))
			assert.True(t, fe.Has(adsc.EndpointType, frontendCluster))
			// The server has the client's new subscriptions once it has read their requests.
			require.Eventually(t, func() bool {
				return subscribed("eds") == edsBefore-1 && subscribed("rds") == fe.Subscribed(adsc.RouteType)
			}, 10*time.Second, 5*time.Millisecond)
		})
	}
}

func TestEndpointsOnlyChangeSendsOnlyEDSToWatchers(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			e := start(t, map[string]string{"services.yaml": services}, nil)
			fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"), Delta: delta})
			noEDS := e.connect(adsc.Config{Node: node(t, "frontend-2", "frontend", "127.10.0.3", "127.20.0.3"), Delta: delta, SkipEDS: true})
			wait(t, fe, has(adsc.RouteType, "9080", "9081"))
			wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, frontendCluster)) == 2 })
			wait(t, noEDS, has(adsc.RouteType, "9080", "9081"))
			// Let the registration of frontend-2 settle before counting.
			wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, frontendCluster)) == 2 })
			before, beforeNoEDS := len(fe.Responses()), len(noEDS.Responses())

			// A backend proxy registers: only EDS of the backend cluster goes out.
			be := e.connect(adsc.Config{Node: node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2"), Delta: delta})
			wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, backendCluster)) == 1 })
			wait(t, be, has(adsc.RouteType, "9080", "9081"))
			after := fe.Responses()[before:]
			require.NotEmpty(t, after)
			for _, r := range after {
				assert.Equal(t, adsc.EndpointType, r.TypeURL)
				assert.Equal(t, []string{backendCluster}, r.Names)
			}
			// The proxy that watches no endpoints got nothing; give the push queue a
			// barrier: a full push afterwards reaches it, and it must be the only new response.
			e.write("extra.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec: {hosts: [extra.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9082, name: http}], endpoints: [{address: 127.10.9.9}]}
`)
			wait(t, noEDS, has(adsc.ClusterType, "outbound|9082||extra.demo.svc.cluster.local"))
			for _, r := range noEDS.Responses()[beforeNoEDS:] {
				assert.NotEqual(t, adsc.EndpointType, r.TypeURL)
			}
		})
	}
}

// A change of services pushes only the proxies it concerns (Istio's ProxyNeedsPush): a
// proxy whose Sidecar does not reach the changed service is left alone, unless the service
// is in its own namespace (it may select the proxy); the unscoped proxy sees everything.
func TestServiceChangesPushOnlyTheProxiesTheyConcern(t *testing.T) {
	sidecar := func(hosts string) string {
		return `
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: scoped}
spec:
  egress: [{hosts: [` + hosts + `]}]
`
	}
	e := start(t, map[string]string{"services.yaml": services, "sidecar.yaml": sidecar("demo/backend.demo.svc.cluster.local"), "vs.yaml": `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local, api.partner.example]
  http: [{route: [{destination: {host: backend.demo.svc.cluster.local}}]}]
`}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	md, err := structpb.NewStruct(map[string]any{"NAME": "client-1", "NAMESPACE": "scoped", "LABELS": map[string]any{"app": "client"},
		"INSTANCE_IPS": "127.10.0.5", "INTERCEPTION_MODE": "NONE", "WASMESH_LOCALHOST": "127.20.0.5"})
	require.NoError(t, err)
	sc := e.connect(adsc.Config{Node: &core.Node{Id: "sidecar~127.10.0.5~client-1.scoped~scoped.svc.cluster.local", Metadata: md}})
	wait(t, fe, has(adsc.ClusterType, frontendCluster, backendCluster))
	wait(t, sc, has(adsc.ClusterType, backendCluster))
	require.NotContains(t, sc.Names(adsc.ClusterType), frontendCluster)

	pushes := func() uint64 {
		var m dto.Metric
		require.NoError(t, e.d.Metrics.ConvergenceTime.Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	// settled waits until every change so far has reached every proxy it concerns (the
	// server says so: nothing waits in the debouncer or the push queue), then checks that
	// the proxies were pushed want more times than at base, no fewer and no more.
	settled := func(base, want uint64) {
		t.Helper()
		require.Eventually(t, e.d.Settled, 10*time.Second, time.Millisecond, "pushes pending")
		require.Equal(t, base+want, pushes())
	}
	serviceIn := func(name, ns string, port int) string {
		return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %s, namespace: %s}
spec: {hosts: [%s.%s.svc.cluster.local], resolution: STATIC, ports: [{number: %d, name: http}], endpoints: [{address: 127.10.9.9}]}
`, name, ns, name, ns, port)
	}
	// The registrations' pushes.
	require.Eventually(t, e.d.Settled, 10*time.Second, time.Millisecond, "pushes pending")
	base := pushes()

	// Out of the scoped proxy's reach: only the unscoped one is pushed.
	e.write("other.yaml", serviceIn("other", "other", 9090))
	wait(t, fe, has(adsc.ClusterType, "outbound|9090||other.other.svc.cluster.local"))
	settled(base, 1)
	assert.NotContains(t, sc.Names(adsc.ClusterType), "outbound|9090||other.other.svc.cluster.local")

	// An endpoint of a service it watches still reaches it, though the last full push
	// passed it by: its view of that snapshot is first made for this endpoints-only one,
	// and must read this one's endpoints (a view shared from the full snapshot did not).
	e.d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: "backend-9", Namespace: "demo", Labels: map[string]string{"app": "backend"}, IPs: []string{"127.10.9.11"}}}})
	wait(t, sc, hasEndpointIP(backendCluster, "127.10.9.11"))
	wait(t, fe, hasEndpointIP(backendCluster, "127.10.9.11"))
	settled(base+1, 2)
	base += 2

	// In the scoped proxy's namespace: both are pushed, though it does not import it.
	e.write("local.yaml", serviceIn("local", "scoped", 9091))
	wait(t, fe, has(adsc.ClusterType, "outbound|9091||local.scoped.svc.cluster.local"))
	settled(base+1, 2)

	// Routed by a VirtualService it imports, though its Sidecar does not name it: both.
	e.write("partner.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: partner, namespace: other}
spec: {hosts: [api.partner.example], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 9092, name: http}]}
`)
	wait(t, fe, has(adsc.ClusterType, "outbound|9092||api.partner.example"))
	settled(base+3, 2)
	base += 2

	// Within its reach: a new port on the backend reaches both.
	e.write("services.yaml", strings.Replace(services, "ports: [{number: 9081, name: http, targetPort: 8081}]",
		"ports: [{number: 9081, name: http, targetPort: 8081}, {number: 9083, name: http-2}]", 1))
	wait(t, sc, has(adsc.ClusterType, "outbound|9083||backend.demo.svc.cluster.local"))
	wait(t, fe, has(adsc.ClusterType, "outbound|9083||backend.demo.svc.cluster.local"))
	settled(base+3, 2)

	// An endpoints-only change pushes the proxies that watch the cluster: the unscoped one.
	e.write("selected.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: selected, namespace: other}
spec:
  hosts: [selected.other.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9094, name: http}]
  workloadSelector: {labels: {app: selected}}
`)
	wait(t, fe, has(adsc.ClusterType, "outbound|9094||selected.other.svc.cluster.local"))
	settled(base+5, 1)
	e.d.State.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{{Name: "selected-1", Namespace: "other", Labels: map[string]string{"app": "selected"}, IPs: []string{"127.10.9.10"}}}})
	wait(t, fe, hasEndpointIP("outbound|9094||selected.other.svc.cluster.local", "127.10.9.10"))
	settled(base+6, 1)
	base += 2
	assert.NotContains(t, sc.Names(adsc.EndpointType), "outbound|9094||selected.other.svc.cluster.local")

	// Any other kind of change pushes every proxy.
	e.write("dr.yaml", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: other, namespace: other}
spec: {host: other.other.svc.cluster.local, trafficPolicy: {loadBalancer: {simple: RANDOM}}}
`)
	settled(base+5, 2)
	base += 2

	// A Sidecar change (every proxy pushed) widens the scope to the other namespace: the
	// scopes the next services-only push judges by are the new ones.
	e.write("sidecar.yaml", sidecar("demo/backend.demo.svc.cluster.local, other/*"))
	wait(t, sc, has(adsc.ClusterType, "outbound|9090||other.other.svc.cluster.local"))
	settled(base+5, 2)
	e.write("more.yaml", serviceIn("more", "other", 9095))
	wait(t, sc, has(adsc.ClusterType, "outbound|9095||more.other.svc.cluster.local"))
	settled(base+7, 2)
}

func TestNackKeepsLastAcceptedConfig(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	rejectNext := make(chan struct{}, 1)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1"), Reject: func(typ string, names []string) string {
		if typ != adsc.ListenerType {
			return ""
		}
		select {
		case <-rejectNext:
			return "listener 127.20.0.1_9082: bind: address already in use"
		default:
			return ""
		}
	}})
	wait(t, fe, has(adsc.ListenerType, "127.20.0.1_9080", "127.20.0.1_9081"))
	rejectNext <- struct{}{}
	e.write("extra.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec: {hosts: [extra.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9082, name: http}], endpoints: [{address: 127.10.9.9}]}
`)
	wait(t, fe, func(c *adsc.Client) bool {
		for _, r := range c.Responses() {
			if r.Nacked {
				return true
			}
		}
		return false
	})
	// The client kept the listeners it had; the server recorded the NACK and counted it.
	assert.NotContains(t, fe.Names(adsc.ListenerType), "127.20.0.1_9082")
	var l listener.Listener
	assert.True(t, fe.Resource(adsc.ListenerType, "127.20.0.1_9081", &l))
	conn := e.d.Server.Connection("sidecar~127.10.0.1~frontend-1.demo~demo.svc.cluster.local")
	require.NotNil(t, conn)
	require.Eventually(t, func() bool {
		for _, st := range conn.SyncStatus() {
			if st.Type == "lds" {
				return st.Nacks == 1 && strings.Contains(st.NackError, "address already in use")
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1.0, testutil.ToFloat64(e.d.Metrics.Rejects.WithLabelValues("lds")))

	// syncz shows it too.
	body := httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/syncz")
	assert.Contains(t, body, "address already in use")
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}

func TestBadFileKeepsLastGoodConfig(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.ClusterType, frontendCluster, backendCluster))
	// backend's document breaks; frontend's changes port. The frontend change applies, the
	// backend keeps its last good version.
	e.write("services.yaml", strings.Replace(strings.Replace(services, "number: 9080", "number: 9070", 1), "number: 9081", "number: 0", 1))
	wait(t, fe, has(adsc.ClusterType, "outbound|9070||frontend.demo.svc.cluster.local", backendCluster))
	assert.NotContains(t, fe.Names(adsc.ClusterType), frontendCluster)
	body := httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/configz")
	assert.Contains(t, body, "rejected (last good kept)")
	assert.Contains(t, body, "spec.ports[0].number")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.d.Metrics.ConfigRejects.WithLabelValues("ServiceEntry")))
}

func TestSlowClientIsCutWhileOthersAreServed(t *testing.T) {
	// Enough services that one CDS response exceeds gRPC's 64 KiB flow-control window.
	var b strings.Builder
	for i := 0; i < 600; i++ {
		fmt.Fprintf(&b, "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: svc-%d, namespace: load}\n"+
			"spec: {hosts: [service-with-a-long-name-%d.load.svc.cluster.local], resolution: STATIC, ports: [{number: 8080, name: http}], endpoints: [{address: 10.9.%d.%d}]}\n", i, i, i/250, i%250)
	}
	e := start(t, map[string]string{"services.yaml": services, "load.yaml": b.String()}, func(o *discovery.Options) {
		// Long enough for a reader on a loaded machine, short for one that never reads.
		o.Server.SendTimeout = 2 * time.Second
	})
	// The slow client asks for clusters and never reads.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A static window turns off gRPC's window growth, so the unread bytes stay unacknowledged.
	slowConn, err := grpc.NewClient(e.d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64*1024), grpc.WithInitialConnWindowSize(64*1024))
	require.NoError(t, err)
	defer slowConn.Close()
	stream, err := discoverypb.NewAggregatedDiscoveryServiceClient(slowConn).StreamAggregatedResources(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&discoverypb.DiscoveryRequest{TypeUrl: adsc.ClusterType, Node: node(t, "slow", "slow", "127.10.0.9", "127.20.0.9")}))
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.ClusterType, frontendCluster))

	// Transport buffers absorb a few responses; each config change pushes another full CDS
	// until a send blocks past the timeout.
	i := 0
	require.Eventually(t, func() bool {
		i++
		e.write("extra.yaml", fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec: {hosts: [extra.demo.svc.cluster.local], resolution: STATIC, ports: [{number: %d, name: http}], endpoints: [{address: 127.10.9.9}]}
`, 10000+i))
		wait(t, fe, has(adsc.ClusterType, fmt.Sprintf("outbound|%d||extra.demo.svc.cluster.local", 10000+i)))
		return testutil.ToFloat64(e.d.Metrics.WriteTimeouts) >= 1
	}, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		return e.d.Server.Connection("sidecar~127.10.0.9~slow.demo~demo.svc.cluster.local") == nil
	}, 10*time.Second, 10*time.Millisecond)
	// The others were served meanwhile (above) and still are.
	e.write("extra2.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra2, namespace: demo}
spec: {hosts: [extra2.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 9083, name: http}], endpoints: [{address: 127.10.9.8}]}
`)
	wait(t, fe, has(adsc.ClusterType, "outbound|9083||extra2.demo.svc.cluster.local"))
}

func TestAdmissionControlRefusesBeyondTheBurst(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) {
		o.Server.ConnectRate = 0.001
		o.Server.ConnectBurst = 1
		o.Server.ConnectWait = 10 * time.Millisecond
	})
	ok := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, ok, has(adsc.ClusterType, frontendCluster))
	refused := e.connect(adsc.Config{Node: node(t, "frontend-2", "frontend", "127.10.0.2", "127.20.0.2")})
	select {
	case <-refused.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("second connection was not refused")
	}
	assert.Contains(t, refused.Err().Error(), "ResourceExhausted")
	assert.Equal(t, 1.0, testutil.ToFloat64(e.d.Metrics.ConnectionsRejected))
}

func TestDebugEndpoints(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services}, nil)
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.RouteType, "9080", "9081"))
	base := "http://" + e.d.HTTPAddr()
	assert.Equal(t, "ok\n", httpGet(t, base+"/ready"))
	assert.Contains(t, httpGet(t, base+"/debug/registryz"), "127.10.0.1")
	dump := httpGet(t, base+"/debug/config_dump?proxyID=sidecar~127.10.0.1~frontend-1.demo~demo.svc.cluster.local")
	assert.Contains(t, dump, "127.20.0.1_9081")
	assert.Contains(t, httpGet(t, base+"/debug/push_status"), `"services": 2`)
	metrics := httpGet(t, base+"/metrics")
	for _, name := range []string{"pilot_xds{", "pilot_xds_pushes{", "pilot_services 2", "pilot_proxy_convergence_time_bucket", "pilot_debounce_time", "pilot_proxy_queue_time"} {
		assert.Contains(t, metrics, name)
	}
}
