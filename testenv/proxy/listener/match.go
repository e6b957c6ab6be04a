package listener

import (
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
)

// connFacts are what filter_chain_match looks at.
type connFacts struct {
	local, remote netip.AddrPort
	transport     string // "tls" or "raw_buffer"
	sni           string
	alpn          []string // from the ClientHello; plaintext is taken as HTTP (h2c, http/1.1)
}

// plaintextALPN is what the HTTP inspector would report of a plaintext connection: this
// proxy serves HTTP/1.1 and h2c on it.
var plaintextALPN = []string{"http/1.1", "h2c", "http/1.0"}

// level is one criterion of filter_chain_match: how specifically a chain's match meets the
// connection (-1: not at all, 0: the criterion is unset, more: more specific).
type level func(m *listenerv3.FilterChainMatch, f *connFacts) int

// levels are Envoy's criteria in its order. At each level only the chains with the most
// specific match go on, and there is no going back: a chain whose destination port is the
// connection's hides the chains without a port even when it fails a later criterion.
var levels = []level{
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		if p := m.GetDestinationPort(); p != nil {
			return boolScore(uint32(f.local.Port()) == p.GetValue())
		}
		return 0
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		return prefixScore(m.GetPrefixRanges(), f.local.Addr())
	},
	serverNameScore,
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		if t := m.GetTransportProtocol(); t != "" {
			return boolScore(t == f.transport)
		}
		return 0
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		if ps := m.GetApplicationProtocols(); len(ps) > 0 {
			return boolScore(slices.ContainsFunc(ps, func(p string) bool { return slices.Contains(f.alpn, p) }))
		}
		return 0
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		return prefixScore(m.GetDirectSourcePrefixRanges(), f.remote.Addr())
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		local := f.remote.Addr().Unmap().IsLoopback() || f.remote.Addr().Unmap() == f.local.Addr().Unmap()
		switch m.GetSourceType() {
		case listenerv3.FilterChainMatch_SAME_IP_OR_LOOPBACK:
			return boolScore(local)
		case listenerv3.FilterChainMatch_EXTERNAL:
			return boolScore(!local)
		}
		return 0
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		return prefixScore(m.GetSourcePrefixRanges(), f.remote.Addr())
	},
	func(m *listenerv3.FilterChainMatch, f *connFacts) int {
		if ps := m.GetSourcePorts(); len(ps) > 0 {
			return boolScore(slices.Contains(ps, uint32(f.remote.Port())))
		}
		return 0
	},
}

func boolScore(ok bool) int {
	if ok {
		return 1
	}
	return -1
}

// prefixScore: the longest matching range wins (1 + its length).
func prefixScore(ranges []*corev3.CidrRange, a netip.Addr) int {
	if len(ranges) == 0 {
		return 0
	}
	best := -1
	for _, r := range ranges {
		if inRanges([]*corev3.CidrRange{r}, a) {
			best = max(best, 1+int(r.GetPrefixLen().GetValue()))
		}
	}
	return best
}

// serverNameScore: an exact name beats the longest matching "*.suffix" wildcard.
func serverNameScore(m *listenerv3.FilterChainMatch, f *connFacts) int {
	names := m.GetServerNames()
	if len(names) == 0 {
		return 0
	}
	sni := strings.ToLower(f.sni)
	best := -1
	for _, n := range names {
		n = strings.ToLower(n)
		switch {
		case n == sni && sni != "":
			return 1 << 20
		case strings.HasPrefix(n, "*.") && strings.HasSuffix(sni, n[1:]) && len(sni) > len(n)-1:
			best = max(best, len(n))
		}
	}
	return best
}

// pickChain applies filter_chain_match by Envoy's precedence, else the default chain.
func (l *Listener) pickChain(f *connFacts) *filterChain {
	cands := l.chains
	for _, lv := range levels {
		bestScore := -1
		var next []*filterChain
		for _, c := range cands {
			sc := lv(c.proto.GetFilterChainMatch(), f)
			switch {
			case sc > bestScore:
				bestScore, next = sc, append(next[:0], c)
			case sc == bestScore && sc >= 0:
				next = append(next, c)
			}
		}
		if bestScore < 0 {
			return l.defaultChain
		}
		cands = next
	}
	if len(cands) == 0 {
		return l.defaultChain
	}
	return cands[0]
}
