package host

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetricsHostCalls(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{})
	_, h := f.op(t, "metrics", [2]string{"x-hist", "7"}, [2]string{"x-gauge", "10"})
	// counter value : get status : define again gives the same id : same name with
	// another type is another metric : gauge after record 10 then increment -2 :
	// decrementing a counter is BadArgument : get of a histogram is BadArgument : unknown
	// id NotFound : unknown type BadArgument
	assert.Equal(t, "1:0:true:true:8:2:2:1:2", hget(h, "x-metrics"))

	counter, ok := f.p.Metrics().Get("requests_total", MetricCounter)
	require.True(t, ok)
	assert.Equal(t, int64(1), counter.Value)
	gauge, ok := f.p.Metrics().Get("active_requests", MetricGauge)
	require.True(t, ok)
	assert.Equal(t, int64(7), gauge.Value) // on_log decremented it once more
	hist, ok := f.p.Metrics().Get("request_size", MetricHistogram)
	require.True(t, ok)
	assert.Equal(t, uint64(2), hist.Count)
	assert.Equal(t, uint64(21), hist.Sum)
	assert.Equal(t, []uint64{7, 14}, hist.Samples)
	assert.Equal(t, uint64(0), hist.Buckets[2]) // <= 5
	assert.Equal(t, uint64(1), hist.Buckets[3]) // <= 10
	assert.Equal(t, uint64(2), hist.Buckets[4]) // <= 25
	assert.Equal(t, uint64(2), hist.Buckets[len(hist.Buckets)-1])
	_, ok = f.p.Metrics().Get("requests_total", MetricGauge)
	assert.True(t, ok, "same name, other type")
}

func TestMetricsStoreSemantics(t *testing.T) {
	m := NewMetrics()
	c, st := m.define(MetricCounter, "c")
	require.Equal(t, StatusOK, st)
	c2, _ := m.define(MetricCounter, "c")
	assert.Equal(t, c, c2)
	g, _ := m.define(MetricGauge, "c")
	assert.NotEqual(t, c, g)
	assert.Equal(t, StatusOK, m.record(c, 5)) // a counter adds what is recorded
	assert.Equal(t, StatusOK, m.increment(c, 2))
	v, _ := m.get(c)
	assert.Equal(t, uint64(7), v)
	assert.Equal(t, StatusOK, m.increment(g, -3))
	v, _ = m.get(g)
	assert.Equal(t, int64(-3), int64(v))
	hid, _ := m.define(MetricHistogram, "h")
	assert.Equal(t, StatusBadArgument, m.increment(hid, 1))
	_, st = m.define(MetricType(3), "x")
	assert.Equal(t, StatusBadArgument, st)
	assert.Equal(t, StatusNotFound, m.record(12345, 1))
	assert.Len(t, m.Snapshot(), 3)
}
