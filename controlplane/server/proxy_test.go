package server_test

import (
	"context"
	"slices"
	"sort"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/require"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

type (
	sotwStream  = stream[*discoverypb.DiscoveryRequest, *discoverypb.DiscoveryResponse]
	deltaStream = stream[*discoverypb.DeltaDiscoveryRequest, *discoverypb.DeltaDiscoveryResponse]
)

// response is what a test reads of a response of either variant.
type response struct {
	typ, version, nonce string
	names               []string // resources, sorted; each decoded and validated
	removed             []string // delta only, sorted
	versions            map[string]string
	msgs                map[string]proto.Message
}

// proxy is one test proxy on a raw ADS stream of either variant, making requests as Envoy
// makes them: a SotW request restates the whole subscription and the version last
// accepted; a delta request names what it adds and drops.
type proxy struct {
	t        testing.TB
	n        int
	id       string
	delta    bool
	sotw     *sotwStream
	dstr     *deltaStream
	cancel   context.CancelFunc
	sentNode bool
	subs     map[string][]string // current subscription per type (nil: wildcard)
	acked    map[string]string   // SotW: version last accepted per type
	nonces   map[string]string   // latest nonce received per type
	latest   func() string       // the version of the server's snapshot in force
}

func variant(delta bool) string {
	if delta {
		return "delta"
	}
	return "sotw"
}

// forBoth runs a test in State of the World and in Delta.
func forBoth(t *testing.T, f func(t *testing.T, delta bool)) {
	for _, delta := range []bool{false, true} {
		t.Run(variant(delta), func(t *testing.T) { f(t, delta) })
	}
}

// open starts test proxy n's stream without sending anything.
func (m *testMesh) open(n int, delta bool) *proxy {
	p := &proxy{t: m.t, n: n, id: proxyID(n), delta: delta, subs: map[string][]string{}, acked: map[string]string{}, nonces: map[string]string{},
		latest: func() string { return m.pusher.Status().Version }}
	ctx, cancel := context.WithCancel(context.Background())
	m.t.Cleanup(cancel)
	p.cancel = cancel
	if delta {
		st, err := m.ads.DeltaAggregatedResources(ctx)
		require.NoError(m.t, err)
		p.dstr = newStream(ctx, m.t, st.Send, st.Recv)
	} else {
		st, err := m.ads.StreamAggregatedResources(ctx)
		require.NoError(m.t, err)
		p.sotw = newStream(ctx, m.t, st.Send, st.Recv)
	}
	return p
}

// raw sends one request; the node goes with the first, as Envoy sends it. names is the
// SotW subscription, or the delta names to subscribe; unsub the delta names to drop.
func (p *proxy) raw(typ, nonce string, names, unsub []string, errDetail *statuspb.Status, initial map[string]string) {
	p.t.Helper()
	if p.delta {
		r := &discoverypb.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, ResourceNamesSubscribe: names,
			ResourceNamesUnsubscribe: unsub, ErrorDetail: errDetail, InitialResourceVersions: initial}
		if !p.sentNode {
			r.Node = node(p.t, p.n)
		}
		p.dstr.request(r)
	} else {
		r := &discoverypb.DiscoveryRequest{TypeUrl: typ, ResponseNonce: nonce, ResourceNames: names,
			VersionInfo: p.acked[typ], ErrorDetail: errDetail}
		if !p.sentNode {
			r.Node = node(p.t, p.n)
		}
		p.sotw.request(r)
	}
	p.sentNode = true
}

// want sets the subscription of typ to names (none: the wildcard of CDS and LDS), with the
// latest nonce of the type as Envoy sends it.
func (p *proxy) want(typ string, names ...string) {
	p.t.Helper()
	old, had := p.subs[typ]
	p.subs[typ] = names
	if !p.delta {
		p.raw(typ, p.nonces[typ], names, nil, nil, nil)
		return
	}
	var add, drop []string
	for _, n := range names {
		if !slices.Contains(old, n) {
			add = append(add, n)
		}
	}
	for _, n := range old {
		if !slices.Contains(names, n) {
			drop = append(drop, n)
		}
	}
	nonce := p.nonces[typ]
	if !had {
		nonce = ""
	}
	p.raw(typ, nonce, add, drop, nil, nil)
}

// ack accepts a response, and returns it.
func (p *proxy) ack(r response) response {
	p.t.Helper()
	if !p.delta {
		p.acked[r.typ] = r.version
	}
	p.raw(r.typ, r.nonce, p.resent(r.typ), nil, nil, nil)
	return r
}

// nack rejects a response; a SotW proxy sends back the version it last accepted.
func (p *proxy) nack(r response, msg string) {
	p.t.Helper()
	p.raw(r.typ, r.nonce, p.resent(r.typ), nil, nack(msg), nil)
}

// resent is the subscription an ACK carries: SotW restates it, delta names nothing new.
func (p *proxy) resent(typ string) []string {
	if p.delta {
		return nil
	}
	return p.subs[typ]
}

// next reads the next response; every resource is decoded and validated.
func (p *proxy) next() response {
	p.t.Helper()
	r := response{versions: map[string]string{}, msgs: map[string]proto.Message{}}
	add := func(a *anypb.Any) string {
		name, msg := validated(p.t, r.typ, a)
		r.names = append(r.names, name)
		r.msgs[name] = msg
		return name
	}
	if p.delta {
		d := p.dstr.next()
		r.typ, r.version, r.nonce = d.GetTypeUrl(), d.GetSystemVersionInfo(), d.GetNonce()
		r.removed = slices.Sorted(slices.Values(d.GetRemovedResources()))
		for _, res := range d.GetResources() {
			name := add(res.GetResource())
			require.Equal(p.t, name, res.GetName(), "delta resource name")
			require.NotEmpty(p.t, res.GetVersion(), "delta resource %s version", name)
			r.versions[name] = res.GetVersion()
		}
	} else {
		s := p.sotw.next()
		r.typ, r.version, r.nonce = s.GetTypeUrl(), s.GetVersionInfo(), s.GetNonce()
		for _, a := range s.GetResources() {
			add(a)
		}
	}
	sort.Strings(r.names)
	p.nonces[r.typ] = r.nonce
	return r
}

// nextOf reads the next response and requires its type.
func (p *proxy) nextOf(typ string) response {
	p.t.Helper()
	r := p.next()
	require.Equal(p.t, typ, r.typ, "type of the next response to %s (%s, resources %v, removed %v)", p.id, r.version, r.names, r.removed)
	return r
}

// close ends the stream as a proxy going away does.
func (p *proxy) close() { p.cancel() }

// connect subscribes in Envoy's order (CDS; EDS for its EDS clusters; ACK both; LDS; RDS
// for the routes its listeners name; ACK both) and returns the first response of each type.
func (m *testMesh) connect(n int, delta bool) (*proxy, map[string]response) {
	m.t.Helper()
	p := m.open(n, delta)
	got := map[string]response{}
	p.want(cdsType)
	cds := p.nextOf(cdsType)
	got[cdsType] = cds
	p.want(edsType, edsClusters(cds)...)
	eds := p.nextOf(edsType)
	got[edsType] = eds
	p.ack(eds)
	p.ack(cds)
	p.want(ldsType)
	lds := p.nextOf(ldsType)
	got[ldsType] = lds
	p.want(rdsType, routeNames(m.t, lds)...)
	rds := p.nextOf(rdsType)
	got[rdsType] = rds
	p.ack(rds)
	p.ack(lds)
	return p, got
}

// edsClusters are the clusters of a CDS response that take their endpoints from EDS.
func edsClusters(r response) []string {
	var out []string
	for _, name := range r.names {
		if c, ok := r.msgs[name].(*cluster.Cluster); ok && c.GetType() == cluster.Cluster_EDS {
			out = append(out, name)
		}
	}
	return out
}

// routeNames are the route configurations an LDS response's connection managers load by RDS.
func routeNames(t testing.TB, r response) []string {
	var out []string
	for _, name := range r.names {
		l := r.msgs[name].(*listener.Listener)
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var h hcm.HttpConnectionManager
				if f.GetTypedConfig().MessageIs(&h) {
					require.NoError(t, f.GetTypedConfig().UnmarshalTo(&h))
					if rn := h.GetRds().GetRouteConfigName(); rn != "" && !slices.Contains(out, rn) {
						out = append(out, rn)
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// endpointIPs are the addresses of a cluster's endpoints in an EDS response, sorted.
func endpointIPs(r response, clusterName string) []string {
	var out []string
	cla, _ := r.msgs[clusterName].(*endpoint.ClusterLoadAssignment)
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			out = append(out, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	sort.Strings(out)
	return out
}
