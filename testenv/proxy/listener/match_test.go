package listener

import (
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func chains(ms map[string]*listenerv3.FilterChainMatch, order ...string) *Listener {
	l := &Listener{defaultChain: &filterChain{proto: &listenerv3.FilterChain{Name: "default"}}}
	for _, n := range order {
		l.chains = append(l.chains, &filterChain{proto: &listenerv3.FilterChain{Name: n, FilterChainMatch: ms[n]}})
	}
	return l
}

func pick(l *Listener, f connFacts) string {
	if f.local == (netip.AddrPort{}) {
		f.local = netip.MustParseAddrPort("10.0.0.1:8080")
	}
	if f.remote == (netip.AddrPort{}) {
		f.remote = netip.MustParseAddrPort("10.0.0.2:40000")
	}
	if f.transport == "" {
		f.transport = "raw_buffer"
	}
	c := l.pickChain(&f)
	if c == nil {
		return ""
	}
	return c.proto.GetName()
}

// Istio's PERMISSIVE inbound: TLS with the mesh's ALPN, TLS without, plaintext HTTP and
// plaintext TCP.
func TestPickChainIstioPermissive(t *testing.T) {
	l := chains(map[string]*listenerv3.FilterChainMatch{
		"mtls-istio": {TransportProtocol: "tls", ApplicationProtocols: []string{"istio-peer-exchange", "istio"}},
		"tls":        {TransportProtocol: "tls"},
		"plain-http": {TransportProtocol: "raw_buffer", ApplicationProtocols: []string{"http/1.1", "h2c"}},
		"plain-tcp":  {TransportProtocol: "raw_buffer"},
	}, "plain-tcp", "tls", "mtls-istio", "plain-http")
	assert.Equal(t, "mtls-istio", pick(l, connFacts{transport: "tls", alpn: []string{"istio-http/1.1", "istio", "http/1.1"}}))
	assert.Equal(t, "tls", pick(l, connFacts{transport: "tls", alpn: []string{"h2"}}))
	assert.Equal(t, "plain-http", pick(l, connFacts{alpn: plaintextALPN}))
	assert.Equal(t, "plain-tcp", pick(l, connFacts{}))
}

// The most specific value wins at each level, and a chain that won a level is not given
// up for a less specific one when it fails a later level (Envoy does not backtrack).
func TestPickChainPrecedence(t *testing.T) {
	l := chains(map[string]*listenerv3.FilterChainMatch{
		"port-tls":  {DestinationPort: wrapperspb.UInt32(8080), TransportProtocol: "tls"},
		"any-plain": {},
	}, "any-plain", "port-tls")
	assert.Equal(t, "port-tls", pick(l, connFacts{transport: "tls"}))
	assert.Equal(t, "default", pick(l, connFacts{}), "the port chain hides the chain without a port")
	assert.Equal(t, "any-plain", pick(l, connFacts{local: netip.MustParseAddrPort("10.0.0.1:9090")}))

	names := chains(map[string]*listenerv3.FilterChainMatch{
		"exact":    {ServerNames: []string{"api.example.com"}},
		"wildcard": {ServerNames: []string{"*.example.com"}},
		"longer":   {ServerNames: []string{"*.eu.example.com"}},
		"none":     {},
	}, "none", "wildcard", "longer", "exact")
	assert.Equal(t, "exact", pick(names, connFacts{transport: "tls", sni: "API.example.com"}))
	assert.Equal(t, "longer", pick(names, connFacts{transport: "tls", sni: "a.eu.example.com"}))
	assert.Equal(t, "wildcard", pick(names, connFacts{transport: "tls", sni: "b.example.com"}))
	assert.Equal(t, "none", pick(names, connFacts{transport: "tls", sni: "example.com"}))
	assert.Equal(t, "none", pick(names, connFacts{}))

	prefixes := chains(map[string]*listenerv3.FilterChainMatch{
		"wide":   {PrefixRanges: []*corev3.CidrRange{{AddressPrefix: "10.0.0.0", PrefixLen: wrapperspb.UInt32(8)}}},
		"narrow": {PrefixRanges: []*corev3.CidrRange{{AddressPrefix: "10.0.0.0", PrefixLen: wrapperspb.UInt32(24)}}},
	}, "wide", "narrow")
	assert.Equal(t, "narrow", pick(prefixes, connFacts{}))
	assert.Equal(t, "wide", pick(prefixes, connFacts{local: netip.MustParseAddrPort("10.1.0.1:80")}))

	src := chains(map[string]*listenerv3.FilterChainMatch{
		"local":    {SourceType: listenerv3.FilterChainMatch_SAME_IP_OR_LOOPBACK},
		"external": {SourceType: listenerv3.FilterChainMatch_EXTERNAL},
	}, "local", "external")
	assert.Equal(t, "external", pick(src, connFacts{}))
	assert.Equal(t, "local", pick(src, connFacts{remote: netip.MustParseAddrPort("127.0.0.1:5000")}))
	assert.Equal(t, "local", pick(src, connFacts{remote: netip.MustParseAddrPort("10.0.0.1:5000")}))
}
