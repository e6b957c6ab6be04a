package upstream

import (
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
)

// hostsAt makes n hosts of a priority, the first healthy ones healthy and the rest
// UNHEALTHY.
func hostsAt(priority uint32, n, healthy int) []*Host {
	var out []*Host
	for i := 0; i < n; i++ {
		h := &Host{Address: fmt.Sprintf("10.0.%d.%d:80", priority, i), Priority: priority, Weight: 1, st: &hostState{}}
		if i >= healthy {
			h.Health = corev3.HealthStatus_UNHEALTHY
		}
		out = append(out, h)
	}
	return out
}

// TestPriorityLoads checks the priority loads against the tables of Envoy's "Priority
// levels" and "Panic threshold" documentation (100 hosts per priority, so that the healthy
// percentages are exact). Where the documentation's rounding differs from Envoy's code
// (LoadBalancerBase::recalculatePriorityLoad gives the rounding remainder to the first
// priority with health), the code's value is expected and the documented one noted.
func TestPriorityLoads(t *testing.T) {
	for _, tc := range []struct {
		healthy []int // percent healthy per priority
		loads   []int
		panic   []bool
	}{
		{[]int{100, 100}, []int{100, 0}, []bool{false, false}},
		{[]int{72, 100}, []int{100, 0}, []bool{false, false}},
		{[]int{71, 100}, []int{99, 1}, []bool{false, false}},
		{[]int{50, 100}, []int{70, 30}, []bool{false, false}},
		{[]int{25, 100}, []int{35, 65}, []bool{false, false}},
		{[]int{0, 100}, []int{0, 100}, []bool{false, false}},
		{[]int{71, 71}, []int{99, 1}, []bool{false, false}},
		{[]int{50, 50}, []int{70, 30}, []bool{false, false}},
		{[]int{25, 25}, []int{50, 50}, []bool{true, true}},
		{[]int{5, 65}, []int{8, 92}, []bool{true, false}}, // documented 7/93
		{[]int{25, 25, 100}, []int{35, 35, 30}, []bool{false, false, false}},
		{[]int{25, 25, 20}, []int{37, 35, 28}, []bool{true, true, true}}, // documented 36/36/28
	} {
		t.Run(fmt.Sprint(tc.healthy), func(t *testing.T) {
			var hosts []*Host
			for p, h := range tc.healthy {
				hosts = append(hosts, hostsAt(uint32(p), 100, h)...)
			}
			var id uint64
			st := buildState(NewHostSet(hosts), 0, priorityRules{panicThreshold: PanicThreshold}, func() uint64 { id++; return id })
			assert.Equal(t, tc.loads, st.loads)
			for p := range tc.panic {
				assert.Equal(t, tc.panic[p], st.prios[p].panic, "priority %d in panic", p)
			}
		})
	}
}

func TestAllUnhealthyGoesToP0InPanic(t *testing.T) {
	hs := NewHostSet(append(hostsAt(0, 2, 0), hostsAt(1, 2, 0)...))
	var id uint64
	st := buildState(hs, 0, priorityRules{panicThreshold: PanicThreshold}, func() uint64 { id++; return id })
	assert.Equal(t, []int{100, 0}, st.loads)
	assert.True(t, st.prios[0].panic)
	assert.Len(t, st.prios[0].hosts.Hosts, 2, "every host of P0, healthy or not")

	st = buildState(hs, 0, priorityRules{panicThreshold: 0}, func() uint64 { id++; return id })
	c, _ := st.pick(false)
	assert.Nil(t, c, "panic disabled: no host (503 no healthy upstream)")
}

func TestLocalityWeights(t *testing.T) {
	// Envoy's "Locality weighted load balancing" table: X weight 1, Y weight 2, Y healthy.
	for _, tc := range []struct{ healthyX, wantX int }{{100, 33}, {70, 33}, {69, 32}, {50, 26}, {25, 15}, {0, 0}} {
		var hosts []*Host
		for i := 0; i < 100; i++ {
			x := &Host{Address: fmt.Sprintf("10.1.0.%d:80", i), Weight: 1, LocalityWeight: 1,
				Locality: &corev3.Locality{Zone: "x"}, st: &hostState{}}
			if i >= tc.healthyX {
				x.Health = corev3.HealthStatus_UNHEALTHY
			}
			y := &Host{Address: fmt.Sprintf("10.2.0.%d:80", i), Weight: 1, LocalityWeight: 2,
				Locality: &corev3.Locality{Zone: "y"}, st: &hostState{}}
			hosts = append(hosts, x, y)
		}
		var id uint64
		st := buildState(NewHostSet(hosts), 0, priorityRules{panicThreshold: PanicThreshold, localityWeighted: true},
			func() uint64 { id++; return id })
		var wx float64
		for _, l := range st.prios[0].localities {
			if l.hosts.Hosts[0].Locality.GetZone() == "x" {
				wx = l.weight
			}
		}
		// The documented percentages are rounded either way.
		assert.InDelta(t, tc.wantX, 100*wx/st.prios[0].locWeight, 1, "X %d%% healthy", tc.healthyX)
	}
}
