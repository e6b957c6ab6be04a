package upstream

import (
	"math/rand/v2"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Candidates is one set of hosts a balancer chooses among: the hosts of one priority (and,
// with locality weighted load balancing, one locality) as the health, priority and panic
// rules pick them.
type Candidates struct {
	Hosts []*Host
	// ID identifies the set: the same ID always means the same hosts, so balancers that
	// build structures from the hosts (rings, tables) keep them per ID.
	ID uint64
}

// lbState is what the priority and locality rules derive from one host set and one health
// state; it is rebuilt when either changes (Envoy's per-priority load computation).
type lbState struct {
	hs    *HostSet
	gen   uint64
	loads []int // percent per priority, summing to 100 when any host is usable
	prios []prioState
}

type prioState struct {
	panic      bool
	hosts      *Candidates
	localities []localityPick
	locWeight  float64
}

type localityPick struct {
	hosts  *Candidates
	weight float64
}

// priorityRules are the cluster's settings for the state computation.
type priorityRules struct {
	panicThreshold   int // percent; 0 disables panic mode
	localityWeighted bool
}

type localityKey struct{ region, zone, subZone string }

func keyOf(l *corev3.Locality) localityKey {
	return localityKey{l.GetRegion(), l.GetZone(), l.GetSubZone()}
}

// buildState computes Envoy's priority loads:
//
//	health(P)  = min(100, overprovisioning_factor * healthy(P) / total(P))
//	normalized = min(100, Σ health)
//	load(P)    = min(100 - Σ load(<P), health(P) * 100 / normalized)
//
// A priority is in panic (its hosts are used regardless of health) when the normalized
// total health is below 100 and its own healthy share is below the panic threshold; with
// no healthy host at all every request goes to P=0 in panic, unless panic is disabled.
func buildState(hs *HostSet, gen uint64, rules priorityRules, nextID func() uint64) *lbState {
	st := &lbState{hs: hs, gen: gen}
	factor := int(hs.OverprovisioningFactor)
	if factor == 0 {
		factor = DefaultOverprovisioningFactor
	}
	n := len(hs.Priorities)
	health := make([]int, n)
	healthyPct := make([]int, n)
	usableHosts := make([][]*Host, n)
	healthyHosts := make([][]*Host, n)
	sum := 0
	for p, hosts := range hs.Priorities {
		for _, h := range hosts {
			if h.Excluded() {
				continue
			}
			usableHosts[p] = append(usableHosts[p], h)
			if h.Healthy() {
				healthyHosts[p] = append(healthyHosts[p], h)
			}
		}
		if total := len(usableHosts[p]); total > 0 {
			health[p] = min(100, factor*len(healthyHosts[p])/total)
			healthyPct[p] = 100 * len(healthyHosts[p]) / total
		}
		sum += health[p]
	}
	normalized := min(100, sum)
	st.loads = make([]int, n)
	st.prios = make([]prioState, n)
	if normalized == 0 {
		// No healthy host anywhere: Envoy sends everything to P=0 in panic mode.
		for p := range usableHosts {
			if len(usableHosts[p]) > 0 && rules.panicThreshold > 0 {
				st.loads[p] = 100
				st.prios[p] = prioState{panic: true, hosts: &Candidates{Hosts: usableHosts[p], ID: nextID()}}
				st.localize(p, usableHosts[p], rules, factor, nextID)
				break
			}
		}
		return st
	}
	assigned := 0
	for p := range health {
		l := min(100-assigned, health[p]*100/normalized)
		st.loads[p] = l
		assigned += l
	}
	if assigned < 100 {
		// Integer rounding leaves a remainder; Envoy gives it to the first priority that has
		// any load.
		for p := range st.loads {
			if health[p] > 0 {
				st.loads[p] += 100 - assigned
				break
			}
		}
	}
	for p := range health {
		panic := normalized < 100 && rules.panicThreshold > 0 && healthyPct[p] < rules.panicThreshold
		hosts := healthyHosts[p]
		if panic {
			hosts = usableHosts[p]
		}
		st.prios[p] = prioState{panic: panic, hosts: &Candidates{Hosts: hosts, ID: nextID()}}
		st.localize(p, hosts, rules, factor, nextID)
	}
	return st
}

// localize groups a priority's hosts by locality with Envoy's effective weights:
// locality_weight * min(1, overprovisioning_factor/100 * healthy / total).
func (st *lbState) localize(p int, chosen []*Host, rules priorityRules, factor int, nextID func() uint64) {
	if !rules.localityWeighted {
		return
	}
	type group struct {
		weight         uint64
		healthy, total int
		hosts          []*Host
	}
	groups := map[localityKey]*group{}
	var order []localityKey
	panic := st.prios[p].panic
	for _, h := range st.hs.Priorities[p] {
		if h.Excluded() {
			continue
		}
		k := keyOf(h.Locality)
		g := groups[k]
		if g == nil {
			g = &group{weight: uint64(h.LocalityWeight)}
			groups[k] = g
			order = append(order, k)
		}
		g.total++
		if h.Healthy() {
			g.healthy++
		}
		if panic || h.Healthy() {
			g.hosts = append(g.hosts, h)
		}
	}
	for _, k := range order {
		g := groups[k]
		avail := 1.0
		if !panic {
			avail = min(1, float64(factor)/100*float64(g.healthy)/float64(g.total))
		}
		w := float64(g.weight) * avail
		if w == 0 || len(g.hosts) == 0 {
			continue
		}
		st.prios[p].localities = append(st.prios[p].localities, localityPick{hosts: &Candidates{Hosts: g.hosts, ID: nextID()}, weight: w})
		st.prios[p].locWeight += w
	}
}

// pick chooses the priority (by load) and, with locality weighting, the locality.
func (st *lbState) pick(useLocality bool) (*Candidates, bool) {
	r := rand.IntN(100)
	for p, l := range st.loads {
		if r >= l {
			r -= l
			continue
		}
		ps := &st.prios[p]
		if useLocality && ps.locWeight > 0 {
			x := rand.Float64() * ps.locWeight
			for _, lp := range ps.localities {
				if x < lp.weight {
					return lp.hosts, ps.panic
				}
				x -= lp.weight
			}
		}
		return ps.hosts, ps.panic
	}
	return nil, false
}
