package xds

import (
	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/envoyfilter"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// Snapshot is a push snapshot with what the generators build from it, each built once
// however many proxies ask, in typed caches. A derived snapshot keeps what the change behind
// it cannot have changed: an endpoints-only change keeps every cache but the endpoints', and
// inherits the endpoint assignments of the hosts it did not change; a services-only change
// inherits the clusters, virtual hosts and assignments of the hosts it did not change.
type Snapshot struct {
	*push.Snapshot
	full *fullCache
	eds  *edsCache
}

// fullCache holds what depends on services, configs and mesh config.
type fullCache struct {
	views       push.Cache[viewKey, *View]
	scopes      push.Cache[scopeMemoKey, *Scope]
	traffic     push.Once[*traffic]
	report      push.Once[*Report]
	extensions  push.Cache[extKey, *proxyExtensions]
	compiled    push.Cache[compiledKey, []*envoyfilter.Patch]
	matchInputs push.Once[*matchInputs]
	ecds        push.Cache[ecdsKey, *Resource]
	telemetry   push.Cache[telemetryKey, *telemetryOverlay]
	ports       push.Cache[portsKey, []*outboundPort]
	redirect    push.Cache[redirectKey, []*Resource]
	clusters    push.Cache[clustersKey, []*Resource]
	static      push.Cache[string, *Resource]
	routes      push.Cache[routeKey, *Resource]
	patched     push.Cache[patchedKey, *Resource]
	typeSets    push.Cache[cacheKey, *Resources]
	routeSets   push.Cache[setKey, *Resources]
	// By host: outbound and gRPC clusters, virtual hosts.
	hostResources *push.HostCache[*Resource]
	vhosts        *push.HostCache[vhostEntry]
}

// edsCache holds what depends on endpoints as well.
type edsCache struct {
	assignments *push.HostCache[*Resource] // by host
	sets        push.Cache[setKey, *Resources]
}

func newFullCache(hostResources *push.HostCache[*Resource], vhosts *push.HostCache[vhostEntry]) *fullCache {
	return &fullCache{hostResources: hostResources, vhosts: vhosts}
}

// NewSnapshot is the snapshot of a full build, nothing generated yet.
func NewSnapshot(s *push.Snapshot) *Snapshot {
	return &Snapshot{Snapshot: s, full: newFullCache(push.NewHostCache[*Resource](), push.NewHostCache[vhostEntry]()),
		eds: &edsCache{assignments: push.NewHostCache[*Resource]()}}
}

// WithServices derives the snapshot of a change of the services of hosts only (see
// push.Snapshot.WithServices), or builds anew when the change is large.
func (s *Snapshot) WithServices(version string, configs *config.Index, reg registry.Registry, hosts map[string]struct{}) *Snapshot {
	if !s.Snapshot.Derivable(hosts) {
		b := push.Build(version, s.Mesh, configs, reg)
		b.Options = s.Options
		return NewSnapshot(b)
	}
	return &Snapshot{Snapshot: s.Snapshot.WithServices(version, configs, reg, hosts),
		full: newFullCache(s.full.hostResources.Without(hosts), s.full.vhosts.Without(hosts)),
		eds:  &edsCache{assignments: s.eds.assignments.Without(hosts)}}
}

// WithEndpoints derives the snapshot of a change of the endpoints of hosts only.
func (s *Snapshot) WithEndpoints(version string, reg registry.Registry, hosts map[string]struct{}) *Snapshot {
	return &Snapshot{Snapshot: s.Snapshot.WithEndpoints(version, reg, hosts), full: s.full,
		eds: &edsCache{assignments: s.eds.assignments.Without(hosts)}}
}

// NameSet is a set of resource names some proxies subscribe to, one value for every proxy
// that names exactly that set (package pusher interns them), so what is generated for it is
// generated once.
type NameSet struct {
	Names []string // sorted
}

type setKey struct {
	names *NameSet
	scope string
}

// GenerateSet is Generate for a subscription shared by many proxies: endpoint assignments
// are cached per set and the proxy's EDS key (its scope, and locality when it matters),
// routes per set and route key; other types are generated for the proxy.
func GenerateSet(v *View, typ string, set *NameSet) *Resources {
	build := func() *Resources { return Generate(v, typ, set.Names) }
	switch typ {
	case EndpointType:
		return v.Snapshot.eds.sets.Get(setKey{set, v.EDSKey}, build)
	case RouteType:
		return v.Snapshot.full.routeSets.Get(setKey{set, v.RouteKey()}, build)
	}
	return build()
}
