package proxyconfig

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
)

const (
	hcmFilter = "envoy.filters.network.http_connection_manager"
	tcpFilter = "envoy.filters.network.tcp_proxy"
)

// ListenerFilter is istioctl's: --address, --port, --type (HTTP, TCP, HTTP+TCP), each
// narrowing when set.
type ListenerFilter struct {
	Address string
	Port    uint32
	Type    string
}

// Keep says whether the listener passes the filter.
func (f ListenerFilter) Keep(l *listenerv3.Listener) bool {
	if f.Address != "" && !slices.ContainsFunc(strings.Split(listenerAddresses(l), ","), func(a string) bool { return strings.EqualFold(a, f.Address) }) {
		return false
	}
	return (f.Port == 0 || listenerPort(l) == f.Port) && (f.Type == "" || strings.EqualFold(listenerType(l), f.Type))
}

// Listeners are the dump's active listeners (dynamic, then static) that pass f, sorted as
// istioctl sorts them: by port, address, type.
func (d *Dump) Listeners(f ListenerFilter) ([]*listenerv3.Listener, error) {
	out, err := typed(d, "listeners", "listener", f.Keep)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		switch {
		case listenerPort(a) != listenerPort(b):
			return listenerPort(a) < listenerPort(b)
		case listenerAddress(a) != listenerAddress(b):
			return listenerAddress(a) < listenerAddress(b)
		}
		return listenerType(a) < listenerType(b)
	})
	return out, nil
}

func listenerPort(l *listenerv3.Listener) uint32 {
	return l.GetAddress().GetSocketAddress().GetPortValue()
}

func listenerAddress(l *listenerv3.Listener) string {
	if p := l.GetAddress().GetPipe(); p != nil {
		return p.GetPath()
	}
	return l.GetAddress().GetSocketAddress().GetAddress()
}

func listenerAddresses(l *listenerv3.Listener) string {
	out := []string{listenerAddress(l)}
	for _, a := range l.GetAdditionalAddresses() {
		out = append(out, a.GetAddress().GetSocketAddress().GetAddress())
	}
	return strings.Join(out, ",")
}

func filterChains(l *listenerv3.Listener) []*listenerv3.FilterChain {
	out := slices.Clone(l.GetFilterChains())
	if l.GetDefaultFilterChain() != nil {
		out = append(out, l.GetDefaultFilterChain())
	}
	return out
}

// listenerType is HTTP, TCP, HTTP+TCP or UNKNOWN by the chains' filters (a tcp_proxy to the
// BlackHoleCluster does not count), istioctl's classification.
func listenerType(l *listenerv3.Listener) string {
	var nHTTP, nTCP int
	for _, fc := range filterChains(l) {
		for _, f := range fc.GetFilters() {
			switch f.GetName() {
			case hcmFilter:
				nHTTP++
			case tcpFilter:
				if !strings.Contains(string(f.GetTypedConfig().GetValue()), "BlackHoleCluster") {
					nTCP++
				}
			}
		}
	}
	switch {
	case nHTTP > 0 && nTCP > 0:
		return "HTTP+TCP"
	case nHTTP > 0:
		return "HTTP"
	case nTCP > 0:
		return "TCP"
	}
	return "UNKNOWN"
}

// WriteListeners prints istioctl's listener table: ADDRESSES, PORT, MATCH, DESTINATION,
// a line per filter chain.
func WriteListeners(w io.Writer, listeners []*listenerv3.Listener) error {
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintln(tw, "ADDRESSES\tPORT\tMATCH\tDESTINATION")
	for _, l := range listeners {
		type chain struct{ match, dest string }
		var chains []chain
		for _, fc := range filterChains(l) {
			chains = append(chains, chain{chainMatch(fc.GetFilterChainMatch()), destination(fc.GetFilters())})
		}
		sort.SliceStable(chains, func(i, j int) bool { return chains[i].dest > chains[j].dest })
		for _, c := range chains {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", listenerAddresses(l), listenerPort(l), c.match, c.dest)
		}
	}
	return tw.Flush()
}

// alpnNames are istioctl's names for Istio's ALPN lists.
var alpnNames = []struct {
	name  string
	alpns []string
}{
	{"App: HTTP TLS", []string{"http/1.0", "http/1.1", "h2c", "istio-http/1.0", "istio-http/1.1", "istio-h2"}},
	{"App: Istio HTTP Plain", []string{"istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"}},
	{"App: TCP TLS", []string{"istio-peer-exchange", "istio"}},
	{"App: HTTP", []string{"http/1.0", "http/1.1", "h2c"}},
}

// chainMatch describes a filter chain match as istioctl does (SNI, Trans, App, Addr; ALL).
func chainMatch(m *listenerv3.FilterChainMatch) string {
	var d []string
	if len(m.GetServerNames()) > 0 {
		d = append(d, "SNI: "+strings.Join(m.GetServerNames(), ","))
	}
	if m.GetTransportProtocol() != "" {
		d = append(d, "Trans: "+m.GetTransportProtocol())
	}
	if alpn := m.GetApplicationProtocols(); len(alpn) > 0 {
		named := "App: " + strings.Join(alpn, ",")
		for _, n := range alpnNames {
			if slices.Equal(n.alpns, alpn) {
				named = n.name
				break
			}
		}
		d = append(d, named)
	}
	port := ""
	if m.GetDestinationPort() != nil {
		port = fmt.Sprintf(":%d", m.GetDestinationPort().GetValue())
	}
	if len(m.GetPrefixRanges()) > 0 {
		var p []string
		for _, r := range m.GetPrefixRanges() {
			p = append(p, fmt.Sprintf("%s/%d", r.GetAddressPrefix(), r.GetPrefixLen().GetValue()))
		}
		d = append(d, "Addr: "+strings.Join(p, ",")+port)
	} else if port != "" {
		d = append(d, "Addr: *"+port)
	}
	if len(d) == 0 {
		return "ALL"
	}
	return strings.Join(d, "; ")
}

// destination is where a chain sends: its HTTP route (inline or by RDS name) or TCP cluster.
func destination(filters []*listenerv3.Filter) string {
	for _, f := range filters {
		switch f.GetName() {
		case hcmFilter:
			h := &hcmv3.HttpConnectionManager{}
			if err := unpack(f.GetTypedConfig(), h); err != nil {
				return err.Error()
			}
			if rc := h.GetRouteConfig(); rc != nil {
				return inlineRoute(rc)
			}
			if n := h.GetRds().GetRouteConfigName(); n != "" {
				return "Route: " + n
			}
			return "HTTP"
		case tcpFilter:
			if strings.Contains(string(f.GetTypedConfig().GetValue()), "BlackHoleCluster") {
				continue
			}
			t := &tcpv3.TcpProxy{}
			if err := unpack(f.GetTypedConfig(), t); err != nil {
				return err.Error()
			}
			return clusterDest(t.GetCluster())
		}
	}
	return "Non-HTTP/Non-TCP"
}

func clusterDest(c string) string {
	if strings.Contains(c, "Cluster") { // BlackHoleCluster, PassthroughCluster, InboundPassthroughCluster...
		return c
	}
	return "Cluster: " + c
}

// inlineRoute describes a route configuration inside a listener: the cluster when it sends
// everything to one, else its virtual hosts.
func inlineRoute(rc *routev3.RouteConfiguration) string {
	if vhs := rc.GetVirtualHosts(); len(vhs) == 1 && slices.Equal(vhs[0].GetDomains(), []string{"*"}) && len(vhs[0].GetRoutes()) == 1 {
		r := vhs[0].GetRoutes()[0]
		if c := r.GetRoute().GetCluster(); c != "" && r.GetMatch().GetPrefix() == "/" {
			return clusterDest(c)
		}
	}
	var vh []string
	for _, v := range rc.GetVirtualHosts() {
		var ms []string
		for _, r := range v.GetRoutes() {
			ms = append(ms, routeMatch(r.GetMatch()))
		}
		s := strings.Join(ms, ", ")
		if d := routeDomains(v.GetDomains()); d != "*" {
			s = d + " " + s
		}
		vh = append(vh, s)
	}
	return "Inline Route: " + strings.Join(vh, "; ")
}
