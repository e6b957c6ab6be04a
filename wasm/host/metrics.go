package host

import (
	"sort"
	"sync"
)

// HistogramBounds are the bucket upper bounds the host keeps for histograms: Envoy's
// default histogram buckets, so the stand-in proxy can export the same shape.
var HistogramBounds = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
	30000, 60000, 300000, 600000, 1800000, 3600000}

// maxHistogramSamples bounds the raw values a histogram keeps; counts, sum and buckets stay
// exact beyond it.
const maxHistogramSamples = 10000

// Metrics is a store of guest-defined metrics. By default each Plugin has its own; plugins
// given the same *Metrics share it, the way Envoy's stats are shared by name. Safe for
// concurrent use.
type Metrics struct {
	mu     sync.Mutex
	byKey  map[metricKey]*metric
	byID   map[uint32]*metric
	nextID uint32
}

type metricKey struct {
	name string
	typ  MetricType
}

type metric struct {
	id      uint32
	name    string
	typ     MetricType
	value   int64 // counter or gauge
	count   uint64
	sum     uint64
	buckets []uint64
	samples []uint64
}

// MetricSnapshot is one metric's state.
type MetricSnapshot struct {
	Name string
	Type MetricType
	// Value is the counter's or gauge's value.
	Value int64
	// Count, Sum, Buckets (cumulative, per HistogramBounds, plus +Inf last) and Samples
	// (the first recorded values, up to 10000) describe a histogram.
	Count   uint64
	Sum     uint64
	Buckets []uint64
	Samples []uint64
}

// NewMetrics returns an empty store.
func NewMetrics() *Metrics {
	return &Metrics{byKey: map[metricKey]*metric{}, byID: map[uint32]*metric{}}
}

// define returns the id of name+typ, creating it on first use. The low two bits of an id
// carry its type, as in Envoy, so a stale or forged id of the wrong type is rejected.
func (m *Metrics) define(typ MetricType, name string) (uint32, Status) {
	if typ > MetricHistogram {
		return 0, StatusBadArgument
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := metricKey{name, typ}
	if mt, ok := m.byKey[k]; ok {
		return mt.id, StatusOK
	}
	m.nextID++
	mt := &metric{id: m.nextID<<2 | uint32(typ), name: name, typ: typ}
	if typ == MetricHistogram {
		mt.buckets = make([]uint64, len(HistogramBounds)+1)
	}
	m.byKey[k] = mt
	m.byID[mt.id] = mt
	return mt.id, StatusOK
}

// increment follows Envoy: counters only go up, gauges move either way, histograms cannot
// be incremented.
func (m *Metrics) increment(id uint32, delta int64) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, ok := m.byID[id]
	if !ok {
		return StatusNotFound
	}
	switch mt.typ {
	case MetricCounter:
		if delta < 0 {
			return StatusBadArgument
		}
		mt.value += delta
	case MetricGauge:
		mt.value += delta
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// record follows Envoy: a counter adds the value, a gauge is set, a histogram records it.
func (m *Metrics) record(id uint32, v uint64) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, ok := m.byID[id]
	if !ok {
		return StatusNotFound
	}
	switch mt.typ {
	case MetricCounter:
		mt.value += int64(v)
	case MetricGauge:
		mt.value = int64(v)
	case MetricHistogram:
		mt.count++
		mt.sum += v
		i := sort.SearchFloat64s(HistogramBounds, float64(v))
		for ; i <= len(HistogramBounds); i++ {
			mt.buckets[i]++
		}
		if len(mt.samples) < maxHistogramSamples {
			mt.samples = append(mt.samples, v)
		}
	}
	return StatusOK
}

// get follows Envoy: histograms have no single value.
func (m *Metrics) get(id uint32) (uint64, Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mt, ok := m.byID[id]
	if !ok {
		return 0, StatusNotFound
	}
	if mt.typ == MetricHistogram {
		return 0, StatusBadArgument
	}
	return uint64(mt.value), StatusOK
}

// Snapshot returns every metric, sorted by name then type.
func (m *Metrics) Snapshot() []MetricSnapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MetricSnapshot, 0, len(m.byKey))
	for _, mt := range m.byKey {
		out = append(out, MetricSnapshot{
			Name: mt.name, Type: mt.typ, Value: mt.value, Count: mt.count, Sum: mt.sum,
			Buckets: append([]uint64(nil), mt.buckets...), Samples: append([]uint64(nil), mt.samples...),
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Type < out[j].Type
	})
	return out
}

// Get returns the metric name of type typ.
func (m *Metrics) Get(name string, typ MetricType) (MetricSnapshot, bool) {
	for _, s := range m.Snapshot() {
		if s.Name == name && s.Type == typ {
			return s, true
		}
	}
	return MetricSnapshot{}, false
}
