package upstream

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/wasmesh/wasmesh/testenv/proxy/stats"
)

// builtinLBs are the load balancing policies the Manager knows, by lb_policy. A policy not
// listed here makes a cluster invalid (NACKed), as an Envoy without it would.
func builtinLBs() map[clusterv3.Cluster_LbPolicy]LBFactory {
	return map[clusterv3.Cluster_LbPolicy]LBFactory{
		clusterv3.Cluster_ROUND_ROBIN:   newRoundRobin,
		clusterv3.Cluster_LEAST_REQUEST: newLeastRequest,
		clusterv3.Cluster_RANDOM:        newRandom,
		clusterv3.Cluster_RING_HASH:     newRingHash,
		clusterv3.Cluster_MAGLEV:        newMaglev,
	}
}

// hashBased reports the policies that choose by request hash and so ignore locality
// weights (Envoy's thread-aware balancers build one structure per priority).
func hashBased(p clusterv3.Cluster_LbPolicy) bool {
	return p == clusterv3.Cluster_RING_HASH || p == clusterv3.Cluster_MAGLEV
}

// roundRobin is Envoy's ROUND_ROBIN: hosts in turn, weighted by repetition when weights
// differ.
type roundRobin struct {
	next atomic.Uint64
}

func newRoundRobin(*clusterv3.Cluster, stats.Scope) (LoadBalancer, error) { return &roundRobin{}, nil }

func (r *roundRobin) Choose(c *Candidates, _ *LBContext) *Host {
	hosts := c.Hosts
	n := r.next.Add(1) - 1
	weighted := false
	var total uint64
	for _, h := range hosts {
		w := uint64(max(h.Weight, 1))
		total += w
		if w != 1 {
			weighted = true
		}
	}
	if !weighted {
		return hosts[n%uint64(len(hosts))]
	}
	slot := n % total
	for _, h := range hosts {
		w := uint64(max(h.Weight, 1))
		if slot < w {
			return h
		}
		slot -= w
	}
	return hosts[0]
}

// random is Envoy's RANDOM: a uniformly random host (Envoy's random balancer ignores host
// weights).
type random struct{}

func newRandom(*clusterv3.Cluster, stats.Scope) (LoadBalancer, error) { return random{}, nil }

func (random) Choose(c *Candidates, _ *LBContext) *Host { return c.Hosts[rand.IntN(len(c.Hosts))] }

// leastRequest is Envoy's LEAST_REQUEST. With equal weights it is the power of
// choice_count choices (default two): the host with the fewest active requests among
// choice_count random picks. With unequal weights every host is weighted by
// weight / (active_requests + 1)^active_request_bias and chosen in proportion (Envoy uses
// an EDF schedule with the same weights).
type leastRequest struct {
	choices int
	bias    float64
}

func newLeastRequest(cfg *clusterv3.Cluster, _ stats.Scope) (LoadBalancer, error) {
	lr := &leastRequest{choices: 2, bias: 1}
	if c := cfg.GetLeastRequestLbConfig(); c != nil {
		if v := c.GetChoiceCount(); v != nil {
			if v.GetValue() < 2 {
				return nil, fmt.Errorf("least_request_lb_config.choice_count must be at least 2")
			}
			lr.choices = int(v.GetValue())
		}
		if b := c.GetActiveRequestBias(); b != nil {
			lr.bias = b.GetDefaultValue()
			if lr.bias < 0 {
				return nil, fmt.Errorf("least_request_lb_config.active_request_bias must be non-negative")
			}
		}
	}
	return lr, nil
}

func (l *leastRequest) Choose(c *Candidates, _ *LBContext) *Host {
	hosts := c.Hosts
	if len(hosts) == 1 {
		return hosts[0]
	}
	equal := true
	for _, h := range hosts[1:] {
		if h.Weight != hosts[0].Weight {
			equal = false
			break
		}
	}
	if equal {
		var best *Host
		for i := 0; i < l.choices; i++ {
			h := hosts[rand.IntN(len(hosts))]
			if best == nil || h.ActiveRequests() < best.ActiveRequests() {
				best = h
			}
		}
		return best
	}
	weights := make([]float64, len(hosts))
	var total float64
	for i, h := range hosts {
		w := float64(max(h.Weight, 1))
		if l.bias != 0 {
			w /= math.Pow(float64(h.ActiveRequests()+1), l.bias)
		}
		weights[i] = w
		total += w
	}
	x := rand.Float64() * total
	for i, w := range weights {
		if x < w {
			return hosts[i]
		}
		x -= w
	}
	return hosts[len(hosts)-1]
}

// hashTables keeps a balancer's structure per candidate set.
type hashTables[T any] struct {
	mu     sync.Mutex
	tables map[uint64]T
	build  func([]*Host) T
}

func (t *hashTables[T]) get(c *Candidates) T {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tb, ok := t.tables[c.ID]; ok {
		return tb
	}
	if t.tables == nil || len(t.tables) >= 16 {
		// Candidate sets are replaced whenever hosts or health change; old ones are not
		// asked for again.
		t.tables = map[uint64]T{}
	}
	tb := t.build(c.Hosts)
	t.tables[c.ID] = tb
	return tb
}

// ringHash is Envoy's RING_HASH (Ketama): every host gets a number of points on a 64-bit
// ring in proportion to its weight, each the xxHash64 of "<address>_<n>"; a request goes
// to the first point at or after its hash. Without a hash (no hash policy matched) the
// hash is random, as in Envoy.
type ringHash struct {
	minSize, maxSize uint64
	tables           hashTables[*ring]
	size, minHashes  *stats.Gauge
	maxHashes        *stats.Gauge
}

type ringEntry struct {
	hash uint64
	host *Host
}

type ring []ringEntry

const (
	defaultMinRingSize = 1024
	defaultMaxRingSize = 8 * 1024 * 1024
)

func newRingHash(cfg *clusterv3.Cluster, sc stats.Scope) (LoadBalancer, error) {
	r := &ringHash{minSize: defaultMinRingSize, maxSize: defaultMaxRingSize}
	if c := cfg.GetRingHashLbConfig(); c != nil {
		if v := c.GetMinimumRingSize(); v != nil {
			r.minSize = v.GetValue()
		}
		if v := c.GetMaximumRingSize(); v != nil {
			r.maxSize = v.GetValue()
		}
		if c.GetHashFunction() != clusterv3.Cluster_RingHashLbConfig_XX_HASH {
			return nil, fmt.Errorf("ring_hash_lb_config.hash_function %s is not supported (only XX_HASH)", c.GetHashFunction())
		}
	}
	if r.minSize > r.maxSize {
		return nil, fmt.Errorf("ring_hash_lb_config: minimum_ring_size (%d) > maximum_ring_size (%d)", r.minSize, r.maxSize)
	}
	if !sc.IsZero() {
		r.size, r.minHashes, r.maxHashes = sc.Gauge("ring_hash_lb.size"), sc.Gauge("ring_hash_lb.min_hashes_per_host"), sc.Gauge("ring_hash_lb.max_hashes_per_host")
	}
	r.tables.build = r.buildRing
	return r, nil
}

func (r *ringHash) buildRing(hosts []*Host) *ring {
	var totalWeight float64
	for _, h := range hosts {
		totalWeight += float64(max(h.Weight, 1))
	}
	minNorm := 1.0
	for _, h := range hosts {
		minNorm = min(minNorm, float64(max(h.Weight, 1))/totalWeight)
	}
	// Envoy: scale so that the lightest host gets at least one point while the ring has at
	// least minimum_ring_size and at most maximum_ring_size entries.
	scale := min(math.Ceil(minNorm*float64(r.minSize))/minNorm, float64(r.maxSize))
	out := make(ring, 0, int(scale)+len(hosts))
	var target float64
	current := 0.0
	minH, maxH := math.MaxInt, 0
	for _, h := range hosts {
		target += scale * float64(max(h.Weight, 1)) / totalWeight
		n := 0
		for current < target {
			out = append(out, ringEntry{hash: xxhash.Sum64String(h.Address + "_" + strconv.Itoa(n)), host: h})
			n++
			current++
		}
		minH, maxH = min(minH, n), max(maxH, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].hash < out[j].hash })
	if r.size != nil {
		r.size.Set(int64(len(out)))
		r.minHashes.Set(int64(minH))
		r.maxHashes.Set(int64(maxH))
	}
	return &out
}

func (r *ringHash) Choose(c *Candidates, ctx *LBContext) *Host {
	rg := *r.tables.get(c)
	if len(rg) == 0 {
		return c.Hosts[0]
	}
	h := rand.Uint64()
	if ctx != nil && ctx.HasHash {
		h = ctx.Hash
	}
	i := sort.Search(len(rg), func(i int) bool { return rg[i].hash >= h })
	if i == len(rg) {
		i = 0
	}
	// A rejected host (retry host predicate): move along the ring, as Envoy does.
	i = (i + ctx.Attempt()) % len(rg)
	return rg[i].host
}

// maglev is Envoy's MAGLEV: a lookup table of table_size (a prime, default 65537) slots
// filled from every host's permutation (offset and skip from the xxHash64 of its address
// with seeds 0 and 1), weighted; a request goes to table[hash % size].
type maglev struct {
	size       uint64
	tables     hashTables[[]*Host]
	minEntries *stats.Gauge
	maxEntries *stats.Gauge
}

const defaultMaglevTableSize = 65537

func newMaglev(cfg *clusterv3.Cluster, sc stats.Scope) (LoadBalancer, error) {
	m := &maglev{size: defaultMaglevTableSize}
	if v := cfg.GetMaglevLbConfig().GetTableSize(); v != nil {
		m.size = v.GetValue()
		if !isPrime(m.size) {
			return nil, fmt.Errorf("maglev_lb_config.table_size %d is not a prime number", m.size)
		}
	}
	if !sc.IsZero() {
		m.minEntries, m.maxEntries = sc.Gauge("maglev_lb.min_entries_per_host"), sc.Gauge("maglev_lb.max_entries_per_host")
	}
	m.tables.build = m.buildTable
	return m, nil
}

func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for i := uint64(2); i*i <= n; i++ {
		if n%i == 0 {
			return false
		}
	}
	return true
}

func seeded(s string, seed uint64) uint64 {
	d := xxhash.NewWithSeed(seed)
	_, _ = d.WriteString(s)
	return d.Sum64()
}

func (m *maglev) buildTable(hosts []*Host) []*Host {
	type entry struct {
		host          *Host
		offset, skip  uint64
		weight        float64
		target        float64
		next, entries uint64
	}
	var maxW float64
	for _, h := range hosts {
		maxW = max(maxW, float64(max(h.Weight, 1)))
	}
	es := make([]*entry, len(hosts))
	for i, h := range hosts {
		es[i] = &entry{host: h, offset: seeded(h.Address, 0) % m.size, skip: seeded(h.Address, 1)%(m.size-1) + 1,
			weight: float64(max(h.Weight, 1)) / maxW}
	}
	table := make([]*Host, m.size)
	filled := uint64(0)
	for iter := 1.0; filled < m.size; iter++ {
		for _, e := range es {
			if filled >= m.size {
				break
			}
			// Hosts lighter than the heaviest skip some rounds (Envoy's weighted Maglev).
			if iter*e.weight < e.target {
				continue
			}
			e.target++
			for {
				c := (e.offset + e.skip*e.next) % m.size
				e.next++
				if table[c] == nil {
					table[c] = e.host
					e.entries++
					filled++
					break
				}
			}
		}
	}
	if m.minEntries != nil {
		minE, maxE := uint64(math.MaxUint64), uint64(0)
		for _, e := range es {
			minE, maxE = min(minE, e.entries), max(maxE, e.entries)
		}
		m.minEntries.Set(int64(minE))
		m.maxEntries.Set(int64(maxE))
	}
	return table
}

func (m *maglev) Choose(c *Candidates, ctx *LBContext) *Host {
	table := m.tables.get(c)
	h := rand.Uint64()
	if ctx != nil && ctx.HasHash {
		h = ctx.Hash
	}
	if a := ctx.Attempt(); a > 0 {
		// Envoy mutates the hash with many bits set so retries land far away.
		h ^= ^uint64(0) - uint64(a) + 1
	}
	return table[h%uint64(len(table))]
}
