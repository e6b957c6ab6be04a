package push

import (
	"fmt"
	"maps"
	"math/rand/v2"
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

// A long run of endpoints-only changes (layered snapshots, flattened every maxLayers) leaves
// every snapshot answering exactly the endpoints of its moment, and its EDS memo inheriting
// the entries of unchanged hosts only.
func TestEndpointsOnlySnapshotsStayExact(t *testing.T) {
	reg := &hostsRegistry{endpoints: map[string][]*model.Endpoint{}}
	for i := range 20 {
		h := fmt.Sprintf("svc-%d.test", i)
		reg.services = append(reg.services, &model.Service{Hostname: h})
		reg.endpoints[h] = []*model.Endpoint{{Address: fmt.Sprintf("10.0.%d.1", i)}}
	}
	snap := Build("v0", nil, nil, reg)
	type moment struct {
		snap *Snapshot
		want map[string][]*model.Endpoint
	}
	history := []moment{{snap, maps.Clone(reg.endpoints)}}
	rng := rand.New(rand.NewPCG(1, 2))
	buildCount := map[string]int{}
	eds := func(s *Snapshot, h string) any {
		return s.EDS.Get(HostKey{Host: h, Name: "eds"}, func() any { buildCount[h]++; return fmt.Sprint(s.Endpoints(h)) })
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
		history = append(history, moment{snap, maps.Clone(reg.endpoints)})
		require.LessOrEqual(t, snap.epDepth, maxLayers)
		require.LessOrEqual(t, snap.EDS.depth, maxLayers)

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
	// Keys that do not name a host depend on all endpoints: never inherited.
	prev := snap
	prev.EDS.Get("all", func() any { return 1 })
	next := prev.WithEndpoints("last", reg, map[string]struct{}{})
	assert.Equal(t, 2, next.EDS.Get("all", func() any { return 2 }))
}
