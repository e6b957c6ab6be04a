package main

import (
	"hash/maphash"
	"unsafe"

	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// The registry turns a request's label values into metric ids. The ABI defines a metric
// per full name, so every distinct label set is a metric of its own in the proxy; the
// registry defines each once and keeps its id, keyed by the encoded tags.
//
// Metrics with the same tags (the four standard ones, unless configured apart) form a
// group and share one key, so a request encodes its labels once per group, not once per
// metric. The key is built in a reused buffer and looked up without converting it to a
// string, so a request whose label set is already known allocates nothing here.
//
// Encoding the tags of a request (some twenty values, several hundred bytes) and hashing
// the result costs more than the rest of a request in a Wasm guest, so a group first looks
// its label values up in a cache keyed by their hash (as Istio's plugin caches metric ids
// per label set), and encodes them only for a label set it has not met yet.
//
// Cardinality is capped per group, which is per metric: a metric gets at most
// max_label_sets_per_metric label sets. A request that would add one more is recorded
// in none of that group's metrics; instead it increments
//
//	metric=.=<metric full name>;.;wasmesh_telemetry_overflow_total
//
// once per metric it missed. Memory therefore stays bounded whatever values requests
// carry (each tag value is also cut to maxTagValueLen bytes).

const (
	overflowMetricName = "wasmesh_telemetry_overflow_total"
	overflowTagName    = "metric"
)

// metricSink is the host's metric API.
type metricSink interface {
	define(kind statsplan.Kind, name string) uint32
	// record adds a counter value, sets a gauge, or records a histogram sample.
	record(kind statsplan.Kind, id uint32, v int64)
}

type group struct {
	metrics []int           // indices into plan.metrics
	tags    []statsplan.Tag // identical for every metric of the group
	sets    map[string][]uint32
	// known caches the ids of label value lists seen before, by their hash; seen counts
	// its entries, which stay under maxKnown.
	known map[uint64][]knownSet
	seen  int
	// last is the label set of the previous request: most requests repeat it with the
	// very same strings (interned values, fields of cached workloads), which compare by
	// address without hashing.
	last *knownSet
}

// knownSet is a list of label values (one per tag of the group) and its metric ids.
type knownSet struct {
	values []string
	ids    []uint32
}

type registry struct {
	pl       *statsplan.Plan
	sink     metricSink
	groups   []group
	overflow []uint32 // counter id per metric
	buf      []byte
	seed     maphash.Seed
	maxKnown int
}

func newRegistry(pl *statsplan.Plan, sink metricSink) *registry {
	// Different values can encode to the same tags (sanitized or cut), so the cache may
	// hold more lists than the group has label sets, but not without bound.
	r := &registry{pl: pl, sink: sink, groups: make([]group, len(pl.Groups)), seed: maphash.MakeSeed(),
		maxKnown: 2 * pl.MaxLabelSets}
	for g, ms := range pl.Groups {
		r.groups[g] = group{metrics: ms, tags: pl.Metrics[ms[0]].Tags, sets: map[string][]uint32{},
			known: map[uint64][]knownSet{}}
	}
	for i := range pl.Metrics {
		// Defined up front so the counter exists, at zero, before anything overflows.
		r.overflow = append(r.overflow, sink.define(statsplan.Counter, overflowName(pl.Metrics[i].FullName)))
	}
	return r
}

// overflowName is the encoded name of the overflow counter for a metric.
func overflowName(fullName string) string {
	return string(appendTag(nil, overflowTagName, fullName)) + overflowMetricName
}

// report records one request (tcp false) or one TCP connection's report (tcp true) in
// the metrics of that kind: values are its label values (standard labels, then
// dimensions), vals[i] and ok[i] the value of plan metric i (not recorded when !ok).
func (r *registry) report(values []string, vals []int64, ok []bool, tcp bool) {
	for g := range r.groups {
		gr := &r.groups[g]
		if r.pl.Metrics[gr.metrics[0]].TCP != tcp {
			continue
		}
		ids := r.lookup(gr, values)
		for i, mi := range gr.metrics {
			switch {
			case ids == nil:
				r.sink.record(statsplan.Counter, r.overflow[mi], 1)
			case ok[mi]:
				r.sink.record(r.pl.Metrics[mi].Kind, ids[i], vals[mi])
			}
		}
	}
}

// lookup returns the ids of the group's metrics for values, defining them the first time
// the label set is seen; nil when the label set is new and the group is full.
func (r *registry) lookup(gr *group, values []string) []uint32 {
	if gr.last != nil && identical(gr.last.values, gr.tags, values) {
		return gr.last.ids
	}
	var h maphash.Hash
	h.SetSeed(r.seed)
	for _, t := range gr.tags {
		h.WriteString(values[t.Index])
		h.WriteByte(0)
	}
	sum := h.Sum64()
	for i := range gr.known[sum] {
		if k := &gr.known[sum][i]; sameValues(k.values, gr.tags, values) {
			gr.last = k
			return k.ids
		}
	}
	ids := r.lookupEncoded(gr, values)
	if ids != nil && gr.seen < r.maxKnown {
		vs := make([]string, len(gr.tags))
		for i, t := range gr.tags {
			vs[i] = values[t.Index]
		}
		gr.known[sum] = append(gr.known[sum], knownSet{values: vs, ids: ids})
		gr.last = &gr.known[sum][len(gr.known[sum])-1]
		gr.seen++
	}
	return ids
}

// identical reports whether values holds the very strings of known (same address and
// length), which is equality without reading them.
func identical(known []string, tags []statsplan.Tag, values []string) bool {
	for i, t := range tags {
		v := values[t.Index]
		if len(known[i]) != len(v) || unsafe.StringData(known[i]) != unsafe.StringData(v) {
			return false
		}
	}
	return true
}

func sameValues(known []string, tags []statsplan.Tag, values []string) bool {
	for i, t := range tags {
		if known[i] != values[t.Index] {
			return false
		}
	}
	return true
}

// lookupEncoded finds or defines the ids by the encoded tags.
func (r *registry) lookupEncoded(gr *group, values []string) []uint32 {
	r.buf = r.buf[:0]
	for _, t := range gr.tags {
		r.buf = appendTag(r.buf, t.Name, values[t.Index])
	}
	if ids, ok := gr.sets[string(r.buf)]; ok {
		return ids
	}
	if len(gr.sets) >= r.pl.MaxLabelSets {
		return nil
	}
	key := string(r.buf)
	ids := make([]uint32, len(gr.metrics))
	for i, mi := range gr.metrics {
		m := &r.pl.Metrics[mi]
		ids[i] = r.sink.define(m.Kind, key+m.FullName)
	}
	gr.sets[key] = ids
	return ids
}

// labelSets returns how many label sets the metric has.
func (r *registry) labelSets(metric int) int {
	return len(r.groups[r.pl.Metrics[metric].Group].sets)
}
