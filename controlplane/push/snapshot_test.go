package push

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// hostsRegistry is a registry of services whose endpoints the test sets directly.
type hostsRegistry struct {
	services  []*model.Service
	endpoints map[string][]*model.Endpoint
}

func (r *hostsRegistry) Name() string                         { return "test" }
func (r *hostsRegistry) Services() []*model.Service           { return r.services }
func (r *hostsRegistry) Endpoints(h string) []*model.Endpoint { return r.endpoints[h] }
func (r *hostsRegistry) AddHandler(registry.Handler)          {}

// servicesWithOneEndpoint is a registry of n services svc-<i>.test, each with one endpoint.
func servicesWithOneEndpoint(n int) *hostsRegistry {
	reg := &hostsRegistry{endpoints: map[string][]*model.Endpoint{}}
	for i := range n {
		h := fmt.Sprintf("svc-%d.test", i)
		reg.services = append(reg.services, &model.Service{Hostname: h})
		reg.endpoints[h] = []*model.Endpoint{{Address: fmt.Sprintf("10.0.%d.1", i)}}
	}
	return reg
}

// A long run of endpoints-only changes (layered snapshots, flattened every maxLayers) leaves
// every snapshot answering exactly the endpoints of its moment, and its EDS memo inheriting
// the entries of unchanged hosts only.
func TestEndpointsOnlySnapshotsStayExact(t *testing.T) {
	reg := servicesWithOneEndpoint(20)
	snap := Build("v0", nil, nil, reg)
	type moment struct {
		snap *Snapshot
		want map[string][]*model.Endpoint
	}
	history := []moment{{snap, maps.Clone(reg.endpoints)}}
	rng := rand.New(rand.NewPCG(1, 2))
	buildCount := map[string]int{}
	cache := NewHostCache[string]() // derived with each snapshot, as xds.Snapshot derives its own
	eds := func(s *Snapshot, h string) string {
		return cache.Get(HostKey{Host: h, Name: "eds"}, func() string { buildCount[h]++; return fmt.Sprint(s.Endpoints(h)) })
	}
	for i := range reg.services {
		eds(snap, reg.services[i].Hostname)
	}
	for step := range 3*maxLayers + 3 {
		changed := map[string]struct{}{}
		for range 1 + rng.IntN(3) {
			h := reg.services[rng.IntN(len(reg.services))].Hostname
			changed[h] = struct{}{}
			if rng.IntN(3) == 0 {
				delete(reg.endpoints, h) // the host has no endpoints left
			} else {
				reg.endpoints[h] = []*model.Endpoint{{Address: fmt.Sprintf("10.1.%d.%d", step, rng.IntN(250))}}
			}
		}
		changed["unknown.test"] = struct{}{} // not a service: ignored
		before := maps.Clone(buildCount)
		snap = snap.WithEndpoints(fmt.Sprintf("v%d", step+1), reg, changed)
		cache = cache.Without(changed)
		history = append(history, moment{snap, maps.Clone(reg.endpoints)})
		require.LessOrEqual(t, snap.endpoints.depth, maxLayers)
		require.LessOrEqual(t, cache.layer.depth, maxLayers)

		for _, svc := range reg.services {
			h := svc.Hostname
			got := eds(snap, h)
			assert.Equal(t, fmt.Sprint(reg.endpoints[h]), got, "step %d: EDS of %s", step, h)
			_, ch := changed[h]
			if ch {
				assert.Equal(t, before[h]+1, buildCount[h], "step %d: the changed host %s is rebuilt", step, h)
			} else {
				assert.Equal(t, before[h], buildCount[h], "step %d: the unchanged host %s is inherited", step, h)
			}
		}
		assert.Nil(t, snap.Endpoints("unknown.test"))
		for _, m := range history { // earlier snapshots are unchanged
			for _, svc := range reg.services {
				assert.Equal(t, m.want[svc.Hostname], m.snap.Endpoints(svc.Hostname), "snapshot %s, host %s", m.snap.Version, svc.Hostname)
			}
		}
	}
}

// A run of services-only changes (WithServices) leaves every snapshot answering exactly
// what a snapshot built from scratch at its moment answers: services (sorted, by host, by
// namespace, selecting) and endpoints, earlier snapshots unchanged.
func TestServicesOnlySnapshotsMatchAFullBuild(t *testing.T) {
	reg := &hostsRegistry{endpoints: map[string][]*model.Endpoint{}}
	rng := rand.New(rand.NewPCG(3, 4))
	namespaces := []string{"a", "b", "c"}
	service := func(h string) *model.Service {
		svc := &model.Service{Hostname: h, Namespace: namespaces[rng.IntN(len(namespaces))]}
		if rng.IntN(2) == 0 {
			svc.WorkloadSelector = map[string]string{"app": h}
		}
		return svc
	}
	set := func(h string, svc *model.Service) {
		services := slices.Clone(reg.services)
		reg.services = model.PatchServices(services, h, svc)
		if svc == nil {
			delete(reg.endpoints, h)
		} else {
			reg.endpoints[h] = []*model.Endpoint{{Address: fmt.Sprintf("10.0.%d.%d", rng.IntN(250), rng.IntN(250))}}
		}
	}
	for i := range 40 {
		h := fmt.Sprintf("svc-%02d.test", i)
		set(h, service(h))
	}
	answers := func(s *Snapshot) string {
		var b strings.Builder
		for _, svc := range s.Services {
			fmt.Fprintf(&b, "%s/%s %v %v|", svc.Namespace, svc.Hostname, s.Service(svc.Hostname) == svc, s.Endpoints(svc.Hostname))
		}
		for i := range 45 {
			h := fmt.Sprintf("svc-%02d.test", i)
			if s.Service(h) == nil {
				fmt.Fprintf(&b, "-%s %v|", h, s.Endpoints(h))
			}
		}
		for _, ns := range namespaces {
			for _, svc := range s.ServicesIn(ns) {
				fmt.Fprintf(&b, "in %s: %s|", ns, svc.Hostname)
			}
			for i := range 45 {
				for _, svc := range s.ServicesSelecting(ns, map[string]string{"app": fmt.Sprintf("svc-%02d.test", i)}) {
					fmt.Fprintf(&b, "selecting in %s: %s|", ns, svc.Hostname)
				}
			}
		}
		return b.String()
	}
	snap := Build("v0", nil, nil, reg)
	type moment struct {
		snap *Snapshot
		want string
	}
	var history []moment
	for step := range 3*maxLayers + 3 {
		changed := map[string]struct{}{}
		for range 1 + rng.IntN(2) {
			h := fmt.Sprintf("svc-%02d.test", rng.IntN(45)) // some hosts come and go
			changed[h] = struct{}{}
			if rng.IntN(3) == 0 {
				set(h, nil)
			} else {
				set(h, service(h))
			}
		}
		snap = snap.WithServices(fmt.Sprintf("v%d", step+1), nil, reg, changed)
		require.LessOrEqual(t, snap.endpoints.depth, maxLayers)
		want := answers(Build("fresh", nil, nil, reg))
		require.Equal(t, want, answers(snap), "step %d", step)
		history = append(history, moment{snap, want})
		for _, m := range history {
			require.Equal(t, m.want, answers(m.snap), "snapshot %s changed later", m.snap.Version)
		}
	}
}

// Layered changes keep lookups short and changes cheap: however many endpoints-only changes
// follow each other, no snapshot's endpoints and no host cache sit on more than maxLayers
// layers, and the flattening that bounds them (a copy of every entry) comes once per
// maxLayers changes, not with each change.
func TestLayeredChangesStayBounded(t *testing.T) {
	reg := servicesWithOneEndpoint(4)
	snap := Build("v0", nil, nil, reg)
	cache := NewHostCache[string]()
	changed := map[string]struct{}{"svc-0.test": {}}
	epLinks := func(l *epLayer) (n int) {
		for ; l.parent != nil; l = l.parent {
			n++
		}
		return n
	}
	cacheLinks := func(l *hostLayer[string]) (n int) {
		for ; l.parent != nil; l = l.parent {
			n++
		}
		return n
	}
	const changes = 4 * maxLayers
	epFlat, cacheFlat := 0, 0
	for i := range changes {
		reg.endpoints["svc-0.test"] = []*model.Endpoint{{Address: fmt.Sprintf("10.2.0.%d", i)}}
		snap = snap.WithEndpoints(fmt.Sprintf("v%d", i+1), reg, changed)
		cache = cache.Without(changed)
		ep, hc := epLinks(snap.endpoints), cacheLinks(cache.layer)
		require.LessOrEqual(t, ep, maxLayers, "change %d: endpoints layers", i)
		require.LessOrEqual(t, hc, maxLayers, "change %d: host cache layers", i)
		if ep == 0 {
			epFlat++
		}
		if hc == 0 {
			cacheFlat++
		}
		require.Equal(t, reg.endpoints["svc-0.test"], snap.Endpoints("svc-0.test"))
	}
	assert.LessOrEqual(t, epFlat, changes/maxLayers, "endpoints flattened")
	assert.LessOrEqual(t, cacheFlat, changes/maxLayers, "host cache flattened")
}

// A change of the services of up to a sixteenth of the mesh's hosts derives its snapshot;
// a larger one builds anew, deriving would cost more than it saves.
func TestDerivableUpToASixteenthOfTheMesh(t *testing.T) {
	snap := Build("v0", nil, nil, servicesWithOneEndpoint(32))
	for _, tc := range []struct {
		changed int
		want    bool
	}{{0, true}, {1, true}, {2, true}, {3, false}, {32, false}} {
		hosts := map[string]struct{}{}
		for i := range tc.changed {
			hosts[fmt.Sprintf("svc-%d.test", i)] = struct{}{}
		}
		assert.Equal(t, tc.want, snap.Derivable(hosts), "%d of 32 hosts changed", tc.changed)
	}
}
