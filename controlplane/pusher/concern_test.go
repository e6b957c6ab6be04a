package pusher_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// meshYAML is 20 services in demo, visible mesh-wide (enough for a change of one host to be
// derived rather than built anew), and in namespace other a service and a DNS service that
// only their namespace sees.
func meshYAML() string {
	var b strings.Builder
	for i := range 20 {
		fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s%02d, namespace: demo}
spec: {hosts: [s%02d.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.%d}]}
`, i, i, i+1)
	}
	b.WriteString(`---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: c, namespace: other}
spec: {hosts: [c.other.svc.cluster.local], exportTo: ["."], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.1.0.1}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: dns, namespace: other}
spec: {hosts: [dns.example.com], exportTo: ["."], resolution: DNS, ports: [{number: 443, name: tls, protocol: TLS}]}
`)
	return b.String()
}

const (
	hostS00, hostS01 = "s00.demo.svc.cluster.local", "s01.demo.svc.cluster.local"
	hostC, hostDNS   = "c.other.svc.cluster.local", "dns.example.com"
	clusterS00       = "outbound|80||" + hostS00
	clusterS01       = "outbound|80||" + hostS01
	clusterC         = "outbound|80||" + hostC
)

// store is a config store a test changes: the ServiceEntries go to the registry as a
// source's configs would.
type store struct {
	mu  sync.Mutex
	all map[config.Key]*config.Config
	reg *registry.ServiceEntries
}

func (s *store) List() []*config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*config.Config, 0, len(s.all))
	for _, c := range s.all {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *config.Config) int { return config.CompareKeys(a.Key(), b.Key()) })
	return out
}

// set adds or replaces the configs of y and returns their keys.
func (s *store) set(t *testing.T, y string) []config.Key {
	t.Helper()
	var keys []config.Key
	s.mu.Lock()
	for _, d := range config.ParseFile("test.yaml", []byte(y)) {
		require.Nil(t, d.Err)
		s.all[d.Config.Key()] = d.Config
		keys = append(keys, d.Config.Key())
	}
	s.mu.Unlock()
	s.reg.SetConfigs(s.List())
	return keys
}

// meshPusher runs a pusher over the mesh of meshYAML until the test ends, its snapshots
// with opts (none: the defaults).
func meshPusher(t *testing.T, opts ...push.Options) (*pusher.Pusher, *store) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := &store{all: map[config.Key]*config.Config{}, reg: registry.NewServiceEntries(log, metrics.New(prometheus.NewRegistry()))}
	st.set(t, meshYAML())
	deps := pusher.Deps{Registry: registry.NewAggregate(st.reg), Configs: st, Mesh: mesh.Default}
	if len(opts) > 0 {
		deps.Options = opts[0]
	}
	p := pusher.New(log, metrics.New(prometheus.NewRegistry()), push.DebounceOptions{After: time.Millisecond, Max: time.Second, EnableEDS: true}, deps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, p.Ready, 5*time.Second, time.Millisecond)
	return p, st
}

func proxyIn(t *testing.T, ns, name string) *model.Proxy {
	meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "NAME": name})
	require.NoError(t, err)
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.9.0.1~" + name + "." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta})
	require.NoError(t, err)
	return p
}

// update hands r to the pusher and waits until it has reached every proxy it concerns.
func update(t *testing.T, p *pusher.Pusher, r *push.Request) {
	t.Helper()
	p.ConfigUpdate(r)
	require.Eventually(t, p.Settled, 5*time.Second, time.Millisecond)
}

// watchers are proxies by name with what each has been pushed.
type watchers map[string]*recorder

func (ws watchers) counts() map[string]int {
	out := map[string]int{}
	for name, r := range ws {
		out[name] = len(r.got())
	}
	return out
}

// concerned lists the proxies pushed to since before, sorted.
func (ws watchers) concerned(before map[string]int) []string {
	var out []string
	for name, r := range ws {
		if len(r.got()) > before[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func withHosts(r *push.Request, hosts ...string) *push.Request {
	r.EDSHosts = map[string]struct{}{}
	for _, h := range hosts {
		r.EDSHosts[h] = struct{}{}
	}
	return r
}

// A push concerns the proxies it may change something for (Istio's ProxyNeedsPush): an
// endpoints-only change the proxies watching a changed cluster; a change of services only
// (registry events, ServiceEntry and WorkloadEntry configs) also the proxies that see a
// changed host or share its namespace; an endpoints change of a DNS service, whose endpoints
// live in its cluster, is a full push to those; any other change concerns every proxy.
func TestAPushConcernsTheProxiesItMayChange(t *testing.T) {
	p, _ := meshPusher(t)
	ws := watchers{"demo-1": {}, "demo-2": {}, "other": {}}
	demo1 := p.Watch(proxyIn(t, "demo", "demo-1"), ws["demo-1"])
	p.Watch(proxyIn(t, "demo", "demo-2"), ws["demo-2"]) // same shape as demo-1, no EDS watch
	other := p.Watch(proxyIn(t, "other", "other"), ws["other"])
	demo1.Subscribe(xds.EndpointType, false, []string{clusterS00})
	other.Subscribe(xds.EndpointType, false, []string{clusterC, clusterS01})

	seKey := config.Key{Kind: config.ServiceEntry, Namespace: "other", Name: "c"}
	weKey := config.Key{Kind: config.WorkloadEntry, Namespace: "other", Name: "vm"}
	vsKey := config.Key{Kind: config.VirtualService, Namespace: "demo", Name: "r"}
	cases := []struct {
		name string
		req  *push.Request
		want []string
		full bool
	}{
		{name: "endpoints of a service demo-1 watches", req: push.NewEDS(map[string]struct{}{hostS00: {}}), want: []string{"demo-1"}},
		{name: "endpoints of a service other watches", req: push.NewEDS(map[string]struct{}{hostS01: {}}), want: []string{"other"}},
		{name: "endpoints of a host nobody watches", req: push.NewEDS(map[string]struct{}{"s05.demo.svc.cluster.local": {}})},
		{name: "a service only its namespace sees", req: withHosts(push.NewFull(push.ReasonService), hostC),
			want: []string{"other"}, full: true},
		{name: "a service everyone sees", req: withHosts(push.NewFull(push.ReasonService), hostS01),
			want: []string{"demo-1", "demo-2", "other"}, full: true},
		{name: "ServiceEntry and WorkloadEntry configs", req: withHosts(push.NewFull(push.ReasonConfig, seKey, weKey), hostC),
			want: []string{"other"}, full: true},
		{name: "a config change that does not say which", req: push.NewFull(push.ReasonConfig),
			want: []string{"demo-1", "demo-2", "other"}, full: true},
		{name: "a VirtualService", req: withHosts(push.NewFull(push.ReasonConfig, seKey, vsKey), hostC),
			want: []string{"demo-1", "demo-2", "other"}, full: true},
		{name: "mesh config", req: push.NewFull(push.ReasonMesh), want: []string{"demo-1", "demo-2", "other"}, full: true},
		{name: "endpoints of a DNS service", req: push.NewEDS(map[string]struct{}{hostDNS: {}}), want: []string{"other"}, full: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := ws.counts()
			update(t, p, tc.req)
			assert.Equal(t, tc.want, ws.concerned(before))
			for _, name := range tc.want {
				got := ws[name].got()
				assert.Equal(t, tc.full, got[len(got)-1].Full(), "%s: full push", name)
			}
		})
	}
}

// Which proxies see a host follows the traffic config in force: once a VirtualService in
// demo routes the service only other's namespace sees, a change of that service concerns the
// proxies of demo too.
func TestConcernFollowsTheTrafficConfig(t *testing.T) {
	p, st := meshPusher(t)
	ws := watchers{"demo": {}, "other": {}}
	p.Watch(proxyIn(t, "demo", "demo"), ws["demo"])
	p.Watch(proxyIn(t, "other", "other"), ws["other"])
	serviceC := func() *push.Request { return withHosts(push.NewFull(push.ReasonService), hostC) }

	before := ws.counts()
	update(t, p, serviceC())
	assert.Equal(t, []string{"other"}, ws.concerned(before))

	keys := st.set(t, `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: r, namespace: demo}
spec: {hosts: [c.other.svc.cluster.local], http: [{route: [{destination: {host: c.other.svc.cluster.local}}]}]}
`)
	before = ws.counts()
	update(t, p, push.NewFull(push.ReasonConfig, keys...))
	assert.Equal(t, []string{"demo", "other"}, ws.concerned(before))

	before = ws.counts()
	update(t, p, serviceC())
	assert.Equal(t, []string{"demo", "other"}, ws.concerned(before), "demo now routes the service")
}

// A change of one service in a mesh of many derives its snapshot: what was generated for the
// hosts it did not change is shared with the snapshot before (a change costs what changed),
// the changed host's resources are generated again, and the push status says what was built.
func TestAServiceChangeRegeneratesOnlyItsHost(t *testing.T) {
	p, st := meshPusher(t)
	w := p.Watch(proxyIn(t, "demo", "demo"), &recorder{})
	before, _ := w.Resources(xds.ClusterType, nil)
	require.NotNil(t, before.Find(clusterS00))
	require.NotNil(t, before.Find(clusterS01))

	keys := st.set(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s01, namespace: demo}
spec: {hosts: [s01.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http2}], endpoints: [{address: 10.0.0.2}]}
`)
	update(t, p, withHosts(push.NewFull(push.ReasonConfig, keys...), hostS01))
	after, version := w.Resources(xds.ClusterType, nil)
	assert.Same(t, before.Find(clusterS00), after.Find(clusterS00), "an unchanged host's cluster is shared")
	require.NotNil(t, after.Find(clusterS01))
	assert.NotEqual(t, before.Find(clusterS01).Hash, after.Find(clusterS01).Hash, "the changed host's cluster is new")

	status := p.Status()
	assert.Equal(t, version, status.Version)
	assert.True(t, status.Full)
	assert.Equal(t, map[string]int{push.ReasonConfig: 1}, status.Reasons)
	assert.Equal(t, 22, status.Services)
	assert.Equal(t, len(st.List()), status.Configs)
}

// Proxies that watch the same clusters share one subscription; when one of them leaves, the
// others keep getting the pushes of those clusters.
func TestAProxyLeavingDoesNotSilenceThoseSharingItsWatch(t *testing.T) {
	p, _ := meshPusher(t)
	ws := watchers{"a": {}, "b": {}}
	a := p.Watch(proxyIn(t, "demo", "a"), ws["a"])
	b := p.Watch(proxyIn(t, "demo", "b"), ws["b"])
	a.Subscribe(xds.EndpointType, false, []string{clusterS00})
	b.Subscribe(xds.EndpointType, false, []string{clusterS00})
	assert.Equal(t, map[string]struct{}{clusterS00: {}}, b.Names(xds.EndpointType))

	a.Close()
	before := ws.counts()
	update(t, p, push.NewEDS(map[string]struct{}{hostS00: {}}))
	assert.Equal(t, []string{"b"}, ws.concerned(before))
}

// A services-only change concerns the proxies of the changed service's namespace also when
// their Sidecar imports nothing of it (the service may select them: their inbound config
// changes); a change of a host no snapshot knows concerns nobody.
func TestAServiceConcernsItsNamespaceWhateverItsSidecarImports(t *testing.T) {
	p, st := meshPusher(t)
	ws := watchers{"demo": {}, "other": {}}
	p.Watch(proxyIn(t, "demo", "demo"), ws["demo"])
	p.Watch(proxyIn(t, "other", "other"), ws["other"])
	keys := st.set(t, `
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: other}
spec: {egress: [{hosts: ["demo/*"]}]}
`)
	update(t, p, push.NewFull(push.ReasonConfig, keys...))

	before := ws.counts()
	update(t, p, withHosts(push.NewFull(push.ReasonService), hostC))
	assert.Equal(t, []string{"other"}, ws.concerned(before), "other's own service, which its Sidecar does not import")

	before = ws.counts()
	update(t, p, withHosts(push.NewFull(push.ReasonService), "gone.other.svc.cluster.local"))
	assert.Empty(t, ws.concerned(before), "a host no snapshot knows")
}

// An endpoints-only push keeps the proxy's view of the config (nothing it computed changed)
// but serves the new endpoints from it.
func TestAnEndpointsPushServesTheNewEndpoints(t *testing.T) {
	p, st := meshPusher(t)
	w := p.Watch(proxyIn(t, "demo", "demo"), &recorder{})
	w.Subscribe(xds.EndpointType, false, []string{clusterS00})
	address := func() string {
		res, _ := w.Resources(xds.EndpointType, nil)
		cla := res.Find(clusterS00).Message.(*endpoint.ClusterLoadAssignment)
		return cla.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
	}
	require.Equal(t, "10.0.0.1", address())
	view := w.View()

	st.set(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s00, namespace: demo}
spec: {hosts: [s00.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.99}]}
`)
	update(t, p, push.NewEDS(map[string]struct{}{hostS00: {}}))
	assert.Equal(t, "10.0.0.99", address())
	assert.Same(t, view.Scope, w.View().Scope, "the view's config is kept")
}
