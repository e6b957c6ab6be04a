// Package stats is meshproxy's statistics store, modelled on Envoy's: flat dotted names
// (cluster.<name>.upstream_rq_total), counters, gauges and histograms with Envoy's default
// buckets, tag extraction by the bootstrap's stats_tags (and Envoy's default extractors),
// the stats matcher, and the admin renderings (/stats text and JSON, /stats/prometheus).
package stats

import (
	"math"
	"sort"
	"sync"
	"sync/atomic"
)

// DefaultBuckets are Envoy's default histogram bucket bounds (milliseconds for times).
var DefaultBuckets = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
	30000, 60000, 300000, 600000, 1800000, 3600000}

// Counter is a monotonically increasing stat.
type Counter struct {
	v    atomic.Uint64
	used atomic.Bool
}

// Inc adds one.
func (c *Counter) Inc() { c.Add(1) }

// Add adds n.
func (c *Counter) Add(n uint64) {
	if c == nil {
		return
	}
	c.v.Add(n)
	c.used.Store(true)
}

// Value is the current value.
func (c *Counter) Value() uint64 {
	if c == nil {
		return 0
	}
	return c.v.Load()
}

// Gauge is a stat that goes up and down.
type Gauge struct {
	v    atomic.Int64
	used atomic.Bool
}

// Inc adds one.
func (g *Gauge) Inc() { g.Add(1) }

// Dec subtracts one.
func (g *Gauge) Dec() { g.Add(-1) }

// Add adds n (which may be negative).
func (g *Gauge) Add(n int64) {
	if g == nil {
		return
	}
	g.v.Add(n)
	g.used.Store(true)
}

// Set replaces the value.
func (g *Gauge) Set(n int64) {
	if g == nil {
		return
	}
	g.v.Store(n)
	g.used.Store(true)
}

// Value is the current value.
func (g *Gauge) Value() int64 {
	if g == nil {
		return 0
	}
	return g.v.Load()
}

// Histogram records values into Envoy's default buckets.
type Histogram struct {
	buckets []atomic.Uint64 // one per DefaultBuckets bound, plus +Inf; not cumulative
	count   atomic.Uint64
	sumBits atomic.Uint64 // float64 bits, updated by CAS
}

func newHistogram() *Histogram {
	return &Histogram{buckets: make([]atomic.Uint64, len(DefaultBuckets)+1)}
}

// Record adds one sample.
func (h *Histogram) Record(v float64) {
	if h == nil {
		return
	}
	i := sort.SearchFloat64s(DefaultBuckets, v)
	h.buckets[i].Add(1)
	h.count.Add(1)
	for {
		old := h.sumBits.Load()
		if h.sumBits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// HistogramValue is a histogram's cumulative state.
type HistogramValue struct {
	Count uint64
	Sum   float64
	// Cumulative counts per DefaultBuckets bound (not including +Inf, which is Count).
	Cumulative []uint64
}

// Value returns the cumulative state.
func (h *Histogram) Value() HistogramValue {
	v := HistogramValue{Count: h.count.Load(), Sum: math.Float64frombits(h.sumBits.Load())}
	var run uint64
	for i := range DefaultBuckets {
		run += h.buckets[i].Load()
		v.Cumulative = append(v.Cumulative, run)
	}
	return v
}

// Quantile estimates the q-quantile (0..1) by linear interpolation inside the bucket, the
// way Envoy's histogram summaries read; NaN when empty.
func (v HistogramValue) Quantile(q float64) float64 {
	if v.Count == 0 {
		return math.NaN()
	}
	rank := q * float64(v.Count)
	lower := 0.0
	var prev uint64
	for i, c := range v.Cumulative {
		if float64(c) >= rank && c > prev {
			frac := (rank - float64(prev)) / float64(c-prev)
			return lower + frac*(DefaultBuckets[i]-lower)
		}
		lower, prev = DefaultBuckets[i], c
	}
	return DefaultBuckets[len(DefaultBuckets)-1]
}

// Kind is a stat's type.
type Kind int

// Stat kinds.
const (
	KindCounter Kind = iota
	KindGauge
	KindHistogram
)

// ExternalStat is a stat kept outside the store (the Wasm filters' metrics), read at
// render time. It lives in Envoy's "wasmcustom" custom stat namespace: its stat name is
// "wasmcustom." + Name (what the stats matcher and /stats see, so Istio's "wasm" inclusion
// prefix keeps it), and its Prometheus name is Name without the envoy_ prefix.
type ExternalStat struct {
	Name      string
	Kind      Kind
	Value     int64
	Histogram HistogramValue
	// Proxy marks a stat of the proxy's own kept outside the store (the Wasm plugins'
	// callback counts and times): its name is used as it is, outside the custom namespace.
	Proxy bool
}

// CustomNamespace prefixes the external stats' names (Envoy's Wasm custom stat namespace).
const CustomNamespace = "wasmcustom."

// ExternalSource lists external stats.
type ExternalSource func() []ExternalStat

// Store holds every stat of the process by name. Stats are created on first use and live
// as long as the process, as in Envoy (a removed cluster's stats stay readable).
type Store struct {
	tags    *TagExtractor
	matcher *Matcher

	mu         sync.RWMutex
	counters   map[string]*Counter
	gauges     map[string]*Gauge
	histograms map[string]*Histogram
	externals  []ExternalSource
}

// NewStore returns a store that extracts tags with tags and instantiates only the stats
// matcher accepts (nil for either means Envoy's defaults: default tags, every stat).
func NewStore(tags *TagExtractor, matcher *Matcher) *Store {
	if tags == nil {
		tags = DefaultTagExtractor()
	}
	return &Store{tags: tags, matcher: matcher,
		counters: map[string]*Counter{}, gauges: map[string]*Gauge{}, histograms: map[string]*Histogram{}}
}

// Tags is the store's tag extractor.
func (s *Store) Tags() *TagExtractor { return s.tags }

// AddExternal registers a source of external stats.
func (s *Store) AddExternal(src ExternalSource) {
	s.mu.Lock()
	s.externals = append(s.externals, src)
	s.mu.Unlock()
}

// Counter returns the counter name, creating it. A name the stats matcher rejects gets a
// detached counter that is never rendered (Envoy's null stat).
func (s *Store) Counter(name string) *Counter {
	s.mu.RLock()
	c := s.counters[name]
	s.mu.RUnlock()
	if c != nil {
		return c
	}
	if !s.matcher.Accepts(name) {
		return &Counter{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c = s.counters[name]; c == nil {
		c = &Counter{}
		s.counters[name] = c
	}
	return c
}

// Gauge returns the gauge name, creating it (see Counter).
func (s *Store) Gauge(name string) *Gauge {
	s.mu.RLock()
	g := s.gauges[name]
	s.mu.RUnlock()
	if g != nil {
		return g
	}
	if !s.matcher.Accepts(name) {
		return &Gauge{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if g = s.gauges[name]; g == nil {
		g = &Gauge{}
		s.gauges[name] = g
	}
	return g
}

// Histogram returns the histogram name, creating it (see Counter).
func (s *Store) Histogram(name string) *Histogram {
	s.mu.RLock()
	h := s.histograms[name]
	s.mu.RUnlock()
	if h != nil {
		return h
	}
	if !s.matcher.Accepts(name) {
		return newHistogram()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h = s.histograms[name]; h == nil {
		h = newHistogram()
		s.histograms[name] = h
	}
	return h
}

// Scope prefixes names, as Envoy's stats scopes do.
type Scope struct {
	store  *Store
	prefix string
}

// Scope returns a scope whose stats are named prefix + "." + name.
func (s *Store) Scope(prefix string) Scope { return Scope{store: s, prefix: prefix + "."} }

// Scope returns the sub-scope name of sc.
func (sc Scope) Scope(name string) Scope {
	return Scope{store: sc.store, prefix: sc.prefix + name + "."}
}

// IsZero reports a scope without a store (stats are not kept).
func (sc Scope) IsZero() bool { return sc.store == nil }

// Counter returns the scoped counter.
func (sc Scope) Counter(name string) *Counter { return sc.store.Counter(sc.prefix + name) }

// Gauge returns the scoped gauge.
func (sc Scope) Gauge(name string) *Gauge { return sc.store.Gauge(sc.prefix + name) }

// Histogram returns the scoped histogram.
func (sc Scope) Histogram(name string) *Histogram { return sc.store.Histogram(sc.prefix + name) }

// Sample is one stat as rendered.
type Sample struct {
	Name      string
	Kind      Kind
	Value     int64
	Histogram HistogramValue
	Used      bool
	// External marks Wasm-defined stats (no envoy_ prefix in Prometheus).
	External bool
}

// Snapshot returns every stat sorted by name (counters and gauges before histograms of the
// same name, as Envoy lists them).
func (s *Store) Snapshot() []Sample {
	s.mu.RLock()
	out := make([]Sample, 0, len(s.counters)+len(s.gauges)+len(s.histograms))
	for n, c := range s.counters {
		out = append(out, Sample{Name: n, Kind: KindCounter, Value: int64(c.Value()), Used: c.used.Load()})
	}
	for n, g := range s.gauges {
		out = append(out, Sample{Name: n, Kind: KindGauge, Value: g.Value(), Used: g.used.Load()})
	}
	for n, h := range s.histograms {
		v := h.Value()
		out = append(out, Sample{Name: n, Kind: KindHistogram, Histogram: v, Used: v.Count > 0})
	}
	externals := append([]ExternalSource(nil), s.externals...)
	s.mu.RUnlock()
	for _, src := range externals {
		for _, e := range src() {
			name := e.Name
			if !e.Proxy {
				name = CustomNamespace + name
			}
			if !s.matcher.Accepts(name) {
				continue
			}
			used := e.Value != 0 || e.Histogram.Count > 0 || e.Kind == KindGauge
			out = append(out, Sample{Name: name, Kind: e.Kind, Value: e.Value, Histogram: e.Histogram, Used: used, External: !e.Proxy})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
