package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// fakeSink records what the registry defines and records.
type fakeSink struct {
	names  []string
	values map[uint32]int64
}

func (f *fakeSink) define(_ statsplan.Kind, name string) uint32 {
	for i, n := range f.names {
		if n == name {
			return uint32(i)
		}
	}
	f.names = append(f.names, name)
	return uint32(len(f.names) - 1)
}

func (f *fakeSink) record(_ statsplan.Kind, id uint32, v int64) { f.values[id] += v }

func (f *fakeSink) count(name string) int64 {
	for i, n := range f.names {
		if n == name {
			return f.values[uint32(i)]
		}
	}
	return -1
}

func newTestRegistry(t *testing.T, cfg string) (*registry, *fakeSink, *statsplan.Plan) {
	t.Helper()
	pl, err := statsplan.Load([]byte(cfg), func([]string) ([]byte, bool) { return nil, false })
	require.NoError(t, err)
	sink := &fakeSink{values: map[uint32]int64{}}
	return newRegistry(pl, sink), sink, pl
}

// requestValues are label values for one request with x-user = user.
func requestValues(pl *statsplan.Plan, user string) []string {
	v := make([]string, statsplan.NumStandardLabels+len(pl.Dimensions))
	for i := range v {
		v[i] = "v" + strings.Repeat("x", i)
	}
	v[statsplan.NumStandardLabels] = user
	return v
}

func reportOne(r *registry, pl *statsplan.Plan, values []string) {
	vals := make([]int64, len(pl.Metrics))
	ok := make([]bool, len(pl.Metrics))
	for i := range pl.Metrics {
		vals[i], ok[i] = 1, pl.Metrics[i].Kind == statsplan.Counter
	}
	r.report(values, vals, ok, false)
}

// The cache of known label values answers the same ids as encoding the tags: values that
// differ only in what sanitizing removes share one metric, and the cap still holds.
func TestKnownLabelValuesShareTheEncodedLabelSet(t *testing.T) {
	r, sink, pl := newTestRegistry(t, `{"max_label_sets_per_metric": 2,
		"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`)
	long := strings.Repeat("u", maxTagValueLen)
	for _, u := range []string{"a;.;b", "a;.;b", "a;_;b", long + "1", long + "2", "c", "a;.;b"} {
		reportOne(r, pl, requestValues(pl, u))
	}
	counter := func(user string) int64 {
		for _, n := range sink.names {
			if strings.HasSuffix(n, "istio_requests_total") && strings.Contains(n, "user=.="+user+";.;") {
				return sink.count(n)
			}
		}
		return -1
	}
	assert.Equal(t, int64(4), counter("a;_;b"), "a;.;b sanitizes to a;_;b: one label set")
	assert.Equal(t, int64(2), counter(long), "values cut at the same length: one label set")
	assert.Equal(t, int64(-1), counter("c"), "over the cap")
	assert.Equal(t, int64(1), sink.count("metric=.=istio_requests_total;.;wasmesh_telemetry_overflow_total"))
	assert.Equal(t, 2, r.labelSets(0))
	gr := &r.groups[pl.Metrics[0].Group]
	assert.Equal(t, 4, gr.seen, "four distinct value lists known")
}

// However many distinct values map onto the label sets already there, the cache stays
// bounded.
func TestKnownLabelValuesAreBounded(t *testing.T) {
	r, _, pl := newTestRegistry(t, `{"max_label_sets_per_metric": 3,
		"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`)
	long := strings.Repeat("u", maxTagValueLen)
	for i := range 100 {
		reportOne(r, pl, requestValues(pl, long+strings.Repeat("z", i)))
	}
	gr := &r.groups[pl.Metrics[0].Group]
	assert.Equal(t, 1, r.labelSets(0))
	assert.Equal(t, r.maxKnown, gr.seen)
}

// A label value list seen before is found by its values whatever strings hold them (each
// request's values are new strings): it is known once, however often it comes.
func TestKnownLabelValuesAreFoundByValue(t *testing.T) {
	r, sink, pl := newTestRegistry(t, `{"metrics": [{"name": "requests_total", "dimensions": {"user": "request.headers['x-user']"}}]}`)
	for _, u := range []string{"alice", "bob", "alice", "bob", "alice"} {
		reportOne(r, pl, requestValues(pl, strings.Clone(u)))
	}
	gr := &r.groups[pl.Metrics[0].Group]
	assert.Equal(t, 2, gr.seen, "two value lists known")
	assert.Equal(t, 2, r.labelSets(0))
	total := int64(0)
	for _, n := range sink.names {
		total += sink.count(n)
	}
	assert.Equal(t, int64(5), total, "every request counted")
}
