package registry

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// A source's registry holds what the source said last, services sorted by host, and tells
// its handlers what changed: services changed or gone are a full change of their hosts,
// endpoints an endpoints-only change of their host; saying again what it said (a relist)
// tells nothing. A list a snapshot holds is never changed afterwards, for a few changes
// (patched) or many (made anew).
func TestPublishedHoldsWhatItsSourceSaidLast(t *testing.T) {
	p := NewPublished("kube")
	rec := &recorder{}
	p.AddHandler(rec.handle)
	assert.Equal(t, "kube", p.Name())
	svc := func(i int, port uint32) *model.Service {
		return &model.Service{Hostname: fmt.Sprintf("s%02d.demo.svc.cluster.local", i), Namespace: "demo",
			Ports: []model.Port{{Name: "http", Port: port}}}
	}
	hosts := func() []string {
		var out []string
		for _, s := range p.Services() {
			out = append(out, s.Hostname)
		}
		return out
	}
	last := func() Event { evs := rec.all(); return evs[len(evs)-1] }
	var all []*model.Service
	for i := range 40 {
		all = append(all, svc(i, 80))
	}
	p.SetServices(slices.Clone(all), nil) // many at once: the list is made anew
	require.Len(t, rec.all(), 1)
	assert.True(t, last().Full)
	assert.Len(t, last().Hosts, 40)
	held := p.Services()
	require.True(t, slices.IsSortedFunc(held, model.CompareHosts))
	want := slices.Clone(held)

	p.SetServices([]*model.Service{svc(3, 80), svc(5, 80)}, nil) // said again
	assert.Len(t, rec.all(), 1, "a relist tells nothing")
	assert.Same(t, &held[0], &p.Services()[0], "a relist builds no new list: the one published stays")
	p.SetServices([]*model.Service{svc(3, 8080)}, []string{"s05.demo.svc.cluster.local", "unknown.demo.svc.cluster.local"}) // a few: patched
	require.Len(t, rec.all(), 2)
	assert.Equal(t, Event{Full: true, Hosts: map[string]struct{}{"s03.demo.svc.cluster.local": {}, "s05.demo.svc.cluster.local": {}}}, last())
	assert.Len(t, hosts(), 39)
	assert.NotContains(t, hosts(), "s05.demo.svc.cluster.local")
	assert.Equal(t, uint32(8080), p.Services()[3].Ports[0].Port)
	assert.Equal(t, want, held, "the list held before is unchanged")

	var gone []string
	for i := range 20 {
		gone = append(gone, fmt.Sprintf("s%02d.demo.svc.cluster.local", i))
	}
	held = p.Services()
	want = slices.Clone(held)
	p.SetServices(nil, gone) // many: made anew
	assert.Len(t, last().Hosts, 19, "s05 was gone already")
	assert.Equal(t, []string{"s20.demo.svc.cluster.local", "s39.demo.svc.cluster.local"}, []string{hosts()[0], hosts()[len(hosts())-1]})
	assert.Len(t, hosts(), 20)
	assert.Equal(t, want, held, "the list held before is unchanged")

	n := len(rec.all())
	eps := []*model.Endpoint{{Address: "10.0.0.1", Port: 80, ServicePort: 80}}
	p.SetEndpoints("s20.demo.svc.cluster.local", eps)
	assert.Equal(t, Event{Hosts: map[string]struct{}{"s20.demo.svc.cluster.local": {}}}, last())
	p.SetEndpoints("s20.demo.svc.cluster.local", []*model.Endpoint{{Address: "10.0.0.1", Port: 80, ServicePort: 80}})
	assert.Len(t, rec.all(), n+1, "the same endpoints again tell nothing")
	assert.Equal(t, eps, p.Endpoints("s20.demo.svc.cluster.local"))
	p.SetEndpoints("s20.demo.svc.cluster.local", nil)
	assert.Len(t, rec.all(), n+2)
	assert.Nil(t, p.Endpoints("s20.demo.svc.cluster.local"))
	p.mu.RLock()
	assert.Empty(t, slices.Collect(maps.Keys(p.endpoints)), "no empty entry is kept")
	p.mu.RUnlock()
}
