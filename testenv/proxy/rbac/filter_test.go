package rbac

import (
	"net"
	"net/http/httptest"
	"testing"

	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	rbacnet "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
	"github.com/wasmesh/wasmesh/testenv/proxy/streaminfo"
)

func httpConfig(t *testing.T, store *stats.Store, js string) hcm.FilterConfig {
	t.Helper()
	p := &rbachttp.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(js), p))
	a, err := anypb.New(p)
	require.NoError(t, err)
	fc, err := HTTPFactory(&hcm.Context{Store: store}, "envoy.filters.http.rbac", a)
	require.NoError(t, err)
	return fc
}

func stream(method, path string) *hcm.Stream {
	return &hcm.Stream{Request: httptest.NewRequest(method, path, nil), StatPrefix: "http.in.", FilterState: map[string]any{},
		Info: &streaminfo.Info{DownstreamPeer: "10.0.0.1:1234", DownstreamLocal: "10.0.0.2:80"}}
}

// A LOG engine lets every request through, marks those a policy matched for the access
// log, and counts them as allowed; shadow rules are counted and recorded, never enforced.
func TestHTTPFilterLogAndShadow(t *testing.T) {
	store := stats.NewStore(nil, nil)
	fc := httpConfig(t, store, `{
	  "rules": {"action": "LOG", "policies": {"audit-post": {"permissions": [{"header": {"name": ":method", "stringMatch": {"exact": "POST"}}}], "principals": [{"any": true}]}}},
	  "shadowRules": {"action": "ALLOW", "policies": {"get-only": {"permissions": [{"header": {"name": ":method", "stringMatch": {"exact": "GET"}}}], "principals": [{"any": true}]}}},
	  "shadowRulesStatPrefix": "istio_dry_run_allow_"}`)
	for _, tc := range []struct {
		method       string
		hint         bool
		shadow       string
		shadowPolicy any
	}{
		{"POST", true, "denied", nil},
		{"GET", false, "allowed", "get-only"},
	} {
		s := stream(tc.method, "/")
		f, err := fc.NewFilter(s)
		require.NoError(t, err)
		assert.Equal(t, hcm.Continue, f.DecodeHeaders(s), tc.method)
		assert.Nil(t, s.Response, "never answered")
		assert.Equal(t, tc.hint, s.FilterState[AccessLogHint] == true, tc.method)
		assert.Equal(t, tc.shadow, s.FilterState[ShadowEngineResult], tc.method)
		assert.Equal(t, tc.shadowPolicy, s.FilterState[ShadowEffectivePolicyID], tc.method)
	}
	assert.Equal(t, uint64(2), store.Counter("http.in.rbac.allowed").Value())
	assert.Equal(t, uint64(0), store.Counter("http.in.rbac.denied").Value())
	assert.Equal(t, uint64(1), store.Counter("http.in.rbac.istio_dry_run_allow_shadow_allowed").Value())
	assert.Equal(t, uint64(1), store.Counter("http.in.rbac.istio_dry_run_allow_shadow_denied").Value())
}

func TestFilterConfigErrors(t *testing.T) {
	store := stats.NewStore(nil, nil)
	a, err := anypb.New(&rbachttp.RBAC{ShadowMatcher: nil, Rules: nil, RulesStatPrefix: "x"})
	require.NoError(t, err)
	_, err = HTTPFactory(&hcm.Context{Store: store}, "rbac", a)
	require.NoError(t, err, "no rules: a filter that enforces nothing")

	p := &rbachttp.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(`{"rules": {"policies": {"p": {"permissions": [{"any": true}], "principals": [{"filterState": {"key": "k", "stringMatch": {"exact": "v"}}}]}}}}`), p))
	a, err = anypb.New(p)
	require.NoError(t, err)
	_, err = HTTPFactory(&hcm.Context{Store: store}, "rbac", a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rules: policies[p].principals[0]: principal *rbacv3.Principal_FilterState is not supported")

	n := &rbacnet.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(`{"statPrefix": "tcp.", "delayDeny": "1s"}`), n))
	a, err = anypb.New(n)
	require.NoError(t, err)
	_, err = NewNetworkFilter(store, a)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "delay_deny is not supported")
}

type secureConn struct {
	net.Conn
	t *streaminfo.TLS
}

func (c *secureConn) DownstreamTLS() *streaminfo.TLS { return c.t }

// wrapped is a listener's wrapper around a connection (as crypto/tls's Conn), which
// exposes the connection it wraps.
type wrapped struct{ net.Conn }

func (w *wrapped) NetConn() net.Conn { return w.Conn }

// The network filter reads the peer's identity from the connection's TLS, through the
// listener's wrappers.
func TestNetworkFilterPeerIdentity(t *testing.T) {
	store := stats.NewStore(nil, nil)
	n := &rbacnet.RBAC{}
	require.NoError(t, protojson.Unmarshal([]byte(`{"statPrefix": "tcp.", "rules": {"policies": {"frontend": {"permissions": [{"any": true}],
	  "principals": [{"authenticated": {"principalName": {"exact": "spiffe://cluster.local/ns/demo/sa/frontend"}}}]}}}}`), n))
	a, err := anypb.New(n)
	require.NoError(t, err)
	f, err := NewNetworkFilter(store, a)
	require.NoError(t, err)
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	frontend := &streaminfo.TLS{PeerURISANs: []string{"spiffe://cluster.local/ns/demo/sa/frontend"}}
	other := &streaminfo.TLS{PeerURISANs: []string{"spiffe://cluster.local/ns/demo/sa/other"}}
	assert.True(t, f.Allow(&wrapped{&secureConn{Conn: c1, t: frontend}}))
	assert.False(t, f.Allow(&secureConn{Conn: c1, t: other}))
	assert.False(t, f.Allow(c1), "plaintext")
	assert.Equal(t, uint64(1), store.Counter("tcp.rbac.allowed").Value())
	assert.Equal(t, uint64(2), store.Counter("tcp.rbac.denied").Value())
}
