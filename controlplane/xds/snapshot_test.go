package xds

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
)

// A registry of n services with one endpoint each.
type fixedRegistry struct {
	services  []*model.Service
	endpoints map[string][]*model.Endpoint
}

func (r *fixedRegistry) Name() string                         { return "fixed" }
func (r *fixedRegistry) Services() []*model.Service           { return r.services }
func (r *fixedRegistry) Endpoints(h string) []*model.Endpoint { return r.endpoints[h] }
func (r *fixedRegistry) AddHandler(registry.Handler)          {}

func fixed(n int) *fixedRegistry {
	r := &fixedRegistry{endpoints: map[string][]*model.Endpoint{}}
	for i := range n {
		h := fmt.Sprintf("svc-%d.test", i)
		r.services = append(r.services, &model.Service{Hostname: h})
		r.endpoints[h] = []*model.Endpoint{{Address: fmt.Sprintf("10.0.%d.1", i)}}
	}
	return r
}

// Derived snapshots inherit what was generated per host for the hosts they did not change,
// and nothing else: a snapshot whose caches refer to it (as views do) is collected once no
// push holds it, though its successors still serve what it generated per host.
func TestDerivedSnapshotsInheritPerHostAndDoNotKeepTheirParentAlive(t *testing.T) {
	reg := fixed(40)
	parent := NewSnapshot(push.Build("v0", nil, config.NewIndex(nil), reg))
	collected := make(chan struct{})
	runtime.AddCleanup(parent, func(ch chan struct{}) { close(ch) }, collected)
	parent.full.views.Get(viewKey{"shape"}, func() *View { return &View{Snapshot: parent} }) // refers to its snapshot
	cluster := parent.full.hostResources.Get(push.HostKey{Host: "svc-1.test", Name: "cluster"}, func() *Resource { return &Resource{} })
	assignment := parent.eds.assignments.Get(push.HostKey{Host: "svc-2.test", Name: "assignment"}, func() *Resource { return &Resource{} })
	changed := map[string]struct{}{"svc-3.test": {}}
	snap := parent.WithServices("v1", config.NewIndex(nil), reg, changed).WithEndpoints("v2", reg, changed)
	parent = nil
	for range 20 {
		runtime.GC()
		select {
		case <-collected:
			assert.Same(t, cluster, snap.full.hostResources.Get(push.HostKey{Host: "svc-1.test", Name: "cluster"}, func() *Resource { return &Resource{} }))
			assert.Same(t, assignment, snap.eds.assignments.Get(push.HostKey{Host: "svc-2.test", Name: "assignment"}, func() *Resource { return &Resource{} }))
			other := &View{}
			assert.Same(t, other, snap.full.views.Get(viewKey{"shape"}, func() *View { return other }), "a view is not inherited")
			changedHost := &Resource{}
			assert.Same(t, changedHost, snap.full.hostResources.Get(push.HostKey{Host: "svc-3.test", Name: "cluster"}, func() *Resource { return changedHost }),
				"a changed host's entry is not inherited")
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("the parent snapshot is still reachable from its successors")
}

// An endpoints-only snapshot keeps everything but the endpoints' caches.
func TestEndpointsOnlySnapshotKeepsTheFullCaches(t *testing.T) {
	reg := fixed(20)
	s := NewSnapshot(push.Build("v0", nil, config.NewIndex(nil), reg))
	v := s.full.views.Get(viewKey{"shape"}, func() *View { return &View{} })
	ns := &NameSet{}
	set := s.eds.sets.Get(setKey{names: ns}, func() *Resources { return &Resources{} })
	n := s.WithEndpoints("v1", reg, map[string]struct{}{"svc-1.test": {}})
	assert.Same(t, v, n.full.views.Get(viewKey{"shape"}, func() *View { return &View{} }))
	assert.Same(t, set, s.eds.sets.Get(setKey{names: ns}, func() *Resources { return &Resources{} }), "the parent keeps its own")
	assert.NotSame(t, set, n.eds.sets.Get(setKey{names: ns}, func() *Resources { return &Resources{} }), "endpoint sets are generated anew")
}
