package xds

import (
	"fmt"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/wasmesh/wasmesh/controlplane/envoyfilter"
)

// EnvoyFilter patches are applied to generated resources one resource at a time. A patched
// resource depends only on the unpatched one and on the proxy's patch set (and the Telemetry
// configuration folded into inline telemetry filters), so it is memoized under those: proxies
// of different shapes that share a mesh-wide EnvoyFilter patch a shared listener once.

type patchedKey struct {
	typeURL string
	name    string
	hash    uint64
	set     string
	extra   string
}

// patchedResource memoizes patch(clone of r.Message): the resource it returns, nil when the
// resource was removed. Unchanged results reuse r.
func patchedResource(v *View, r *Resource, set, extra string, patch func(proto.Message) (proto.Message, []*envoyfilter.PatchError)) *Resource {
	k := patchedKey{typeURL: r.Any.GetTypeUrl(), name: r.Name, hash: r.Hash, set: set, extra: extra}
	return v.Snapshot.full.patched.Get(k, func() *Resource {
		m, errs := patch(proto.Clone(r.Message))
		reportOf(v.Snapshot).addPatchErrors(errs)
		switch {
		case m == nil:
			return (*Resource)(nil)
		case proto.Equal(m, r.Message):
			return r
		}
		return NewResource(r.Name, m)
	})
}

// patchListeners applies the proxy's listener and inline-route patches, then adds the
// listeners its ADD patches add, and folds Telemetry into inline telemetry filters.
func patchListeners(v *View, items []*Resource) []*Resource {
	e := extensionsOf(v)
	extra := e.telemetry.inlineKey()
	if !e.patches.HasListenerPatches() && extra == "" {
		return items
	}
	out := make([]*Resource, 0, len(items))
	names := map[string]bool{}
	for _, r := range items {
		p := patchedResource(v, r, e.patches.ID, extra, func(m proto.Message) (proto.Message, []*envoyfilter.PatchError) {
			l, errs := e.patches.PatchListener(m.(*listener.Listener), e.ranks)
			if l == nil {
				return nil, errs
			}
			if extra != "" {
				if _, err := e.telemetry.applyInline(l); err != nil {
					reportOf(v.Snapshot).add(&Problem{Source: e.telemetry.source(), Patch: -1, Resource: "listener " + l.GetName(), Err: err})
				}
			}
			return l, errs
		})
		if p != nil {
			out = append(out, p)
			names[p.Name] = true
		}
	}
	return appendAdded(v, out, names, networking.EnvoyFilter_LISTENER, ListenerType, "listener")
}

// appendAdded appends the resources of applyTo that the proxy's ADD patches add in either
// sidecar context; one whose name is taken (by a generated or an earlier added resource) is
// reported and left out.
func appendAdded(v *View, out []*Resource, names map[string]bool, applyTo networking.EnvoyFilter_ApplyTo, typeURL, kind string) []*Resource {
	e := extensionsOf(v)
	for _, ctx := range []networking.EnvoyFilter_PatchContext{networking.EnvoyFilter_SIDECAR_INBOUND, networking.EnvoyFilter_SIDECAR_OUTBOUND} {
		for _, a := range e.patches.Added(applyTo, ctx) {
			name := a.Value.(interface{ GetName() string }).GetName()
			if names[name] {
				reportOf(v.Snapshot).add(&Problem{Source: a.Patch.Filter, Patch: a.Patch.Index, Resource: kind + " " + name,
					Err: fmt.Errorf("a %s named %s exists already", kind, name)})
				continue
			}
			names[name] = true
			out = append(out, v.Snapshot.full.patched.Get(patchedKey{typeURL: typeURL, name: name, set: a.Patch.String()}, func() *Resource {
				return NewResource(name, a.Value)
			}))
		}
	}
	return out
}

// patchClusters applies the proxy's cluster patches and adds the clusters its ADD patches add.
func patchClusters(v *View, items []*Resource) []*Resource {
	e := extensionsOf(v)
	if !e.patches.HasClusterPatches() {
		return items
	}
	hosts := map[string][]string{}
	for _, in := range v.Inbounds {
		hosts[InboundClusterName(in.Port)] = in.Hosts
	}
	out := make([]*Resource, 0, len(items))
	names := map[string]bool{}
	for _, r := range items {
		h := hosts[r.Name]
		p := patchedResource(v, r, e.patches.ID, fmt.Sprint(h), func(m proto.Message) (proto.Message, []*envoyfilter.PatchError) {
			c, errs := e.patches.PatchCluster(m.(*cluster.Cluster), h)
			if c == nil {
				return nil, errs
			}
			return c, errs
		})
		if p != nil {
			out = append(out, p)
			names[p.Name] = true
		}
	}
	return appendAdded(v, out, names, networking.EnvoyFilter_CLUSTER, ClusterType, "cluster")
}

// patchRoutes applies the proxy's route patches to its outbound route configurations.
func patchRoutes(v *View, items []*Resource) []*Resource {
	e := extensionsOf(v)
	if !e.patches.HasRoutePatches() {
		return items
	}
	out := make([]*Resource, 0, len(items))
	for _, r := range items {
		p := patchedResource(v, r, e.patches.ID, "", func(m proto.Message) (proto.Message, []*envoyfilter.PatchError) {
			rc, errs := e.patches.PatchRouteConfiguration(m.(*route.RouteConfiguration), networking.EnvoyFilter_SIDECAR_OUTBOUND)
			return rc, errs
		})
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// routePatchKey extends View.RouteKey with the proxy's route patches.
func routePatchKey(v *View) string {
	e := extensionsOf(v)
	if !e.patches.HasRoutePatches() {
		return ""
	}
	return "|" + e.patches.ID
}
