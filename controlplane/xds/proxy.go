package xds

import (
	"fmt"
	"sort"
	"strings"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
)

// Inbound is one port a proxy serves for the services that select it.
type Inbound struct {
	Port        uint32 // the workload port (service targetPort or named pod port)
	Protocol    model.Protocol
	ServicePort uint32
	Hosts       []string // services served on this port
}

// View is a proxy as seen through one snapshot: what the generators need to know about it.
type View struct {
	Proxy    *model.Proxy
	Snapshot *push.Snapshot
	Inbounds []Inbound // sorted by port
	// Key holds exactly the proxy properties the generated LDS/CDS/RDS depend on; proxies with
	// equal keys receive identical resources, so results are cached under it.
	Key string
}

// Shape renders every proxy property NewView reads; proxies with the same shape get the
// same view, so connections compute it once per snapshot (see CachedView).
func Shape(p *model.Proxy) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s|%s", p.Type, p.InterceptionMode, p.Namespace, model.SortedLabels(p.Labels), p.Localhost)
	if p.InterceptionMode == model.InterceptionNone {
		b.WriteString("|" + p.IP())
	}
	for _, pp := range p.PodPorts {
		fmt.Fprintf(&b, "|%s=%d", pp.Name, pp.ContainerPort)
	}
	return b.String()
}

type viewKey struct{ shape string }

// CachedView is NewView with the computed part shared by every proxy of the same shape
// (Shape(p) == shape) within a snapshot.
func CachedView(snap *push.Snapshot, p *model.Proxy, shape string) *View {
	shared := snap.Full.Get(viewKey{shape}, func() any { return NewView(snap, p) }).(*View)
	if shared.Proxy == p {
		return shared
	}
	v := *shared
	v.Proxy = p
	return &v
}

// NewView computes the proxy's inbound ports and cache key for a snapshot.
func NewView(snap *push.Snapshot, p *model.Proxy) *View {
	v := &View{Proxy: p, Snapshot: snap}
	named := map[string]uint32{}
	for _, pp := range p.PodPorts {
		if pp.Name != "" {
			named[pp.Name] = pp.ContainerPort
		}
	}
	byPort := map[uint32]*Inbound{}
	for _, svc := range snap.ServicesSelecting(p.Namespace, p.Labels) {
		for _, sp := range svc.Ports {
			port := sp.Port
			if sp.TargetPort != 0 {
				port = sp.TargetPort
			}
			if n := named[sp.Name]; n != 0 {
				port = n
			}
			in := byPort[port]
			if in == nil {
				in = &Inbound{Port: port, Protocol: sp.Protocol, ServicePort: sp.Port}
				byPort[port] = in
			} else if in.Protocol != sp.Protocol && !(in.Protocol.IsHTTP() && sp.Protocol.IsHTTP()) {
				// Two services disagree on a workload port's protocol: TCP is the safe common
				// denominator, as in Istio's conflict handling.
				in.Protocol = model.TCP
			}
			in.Hosts = append(in.Hosts, svc.Hostname)
		}
	}
	for _, in := range byPort {
		v.Inbounds = append(v.Inbounds, *in)
	}
	sort.Slice(v.Inbounds, func(i, j int) bool { return v.Inbounds[i].Port < v.Inbounds[j].Port })

	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%s", p.Type, p.InterceptionMode, p.Namespace, model.SortedLabels(p.Labels))
	if p.InterceptionMode == model.InterceptionNone {
		// Listeners bind the proxy's own addresses only without interception.
		fmt.Fprintf(&b, "|%s|%s", p.Localhost, p.IP())
	}
	for _, in := range v.Inbounds {
		fmt.Fprintf(&b, "|%d/%s", in.Port, in.Protocol)
	}
	v.Key = b.String()
	return v
}

type cacheKey struct {
	typeURL string
	key     string
}

// cached memoizes a per-view result in the snapshot's full cache.
func (v *View) cached(typeURL string, build func() *Resources) *Resources {
	return v.Snapshot.Full.Get(cacheKey{typeURL, v.Key}, func() any { return build() }).(*Resources)
}
