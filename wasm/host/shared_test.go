package host

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSharedDataAcrossInstancesAndCAS(t *testing.T) {
	f := newFixture(t, "kitchen", PluginConfig{VMID: "shared-vm", Instances: 2}, Environment{})
	for i, want := range []string{"1:1:0", "2:0:0", "3:0:0"} {
		s, _, h := f.headersOnly(t, StreamOptions{Worker: i % 2, PinWorker: true}, [2]string{"x-op", "shared"})
		assert.Equal(t, i%2, s.Worker())
		s.Finish(context.Background())
		// value : get status (NotFound the first time) : set status
		assert.Equal(t, want, hget(h, "x-shared"))
	}
	assert.Equal(t, "3", string(f.p.SharedData()["counter"].Value))
	assert.Equal(t, "3", string(f.rt.SharedData("shared-vm")["counter"].Value))
	assert.Empty(t, f.rt.SharedData("other-vm"))

	// The store outlives instances: a replaced instance goes on counting.
	res, _ := f.op(t, "trap")
	require.NotNil(t, res.Failure)
	s, _, h := f.headersOnly(t, StreamOptions{Worker: 0, PinWorker: true}, [2]string{"x-op", "shared"})
	s.Finish(context.Background())
	assert.Equal(t, "4:0:0", hget(h, "x-shared"))

	// set with the current cas succeeds, with a stale one fails with CasMismatch, and the
	// value is the one written with the right cas; a missing key is NotFound.
	_, h = f.op(t, "cas")
	assert.Equal(t, "0:8:b:1", hget(h, "x-cas"))
}

// Shared data and queues belong to the runtime, keyed by vm_id: a replaced instance and
// other plugins of the same vm_id see them.
func TestSharedQueues(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	mod, err := rt.Compile(ctx, guestWasm(t, "kitchen"))
	require.NoError(t, err)
	// The consumer logs "queue ready" after it drained the queue: the event to wait on.
	logs := &logRecorder{}
	env := Environment{Logger: slog.New(logs)}
	consumer, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "consumer", VMID: "q-vm", Configuration: []byte("queue=q")}, env)
	require.NoError(t, err)
	defer consumer.Close(ctx)
	producer, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "producer", VMID: "q-vm"}, env)
	require.NoError(t, err)
	defer producer.Close(ctx)

	pf := &fixture{rt: rt, p: producer}
	for i := 0; i < 3; i++ {
		_, h := pf.op(t, "enqueue", [2]string{"x-vm-id", "q-vm"})
		// resolve OK : enqueue OK : resolve of an unknown queue NotFound : enqueue to an
		// unknown token NotFound
		assert.Equal(t, "0:0:1:1", hget(h, "x-enqueue"))
	}
	// Each enqueue woke the registering root context of the other plugin, which drained
	// the queue.
	eventually(t, &logs.notify, func() bool {
		m, _ := consumer.Metrics().Get("queue_items_total", MetricCounter)
		return m.Value == 3
	}, "consumer drained 3 items")
	q := rt.SharedQueues()
	require.Len(t, q, 1)
	assert.Equal(t, "q-vm", q[0].VMID)
	assert.Equal(t, "q", q[0].Name)
	assert.Empty(t, q[0].Items)
	_, h := pf.op(t, "enqueue", [2]string{"x-vm-id", "wrong-vm"})
	assert.Equal(t, "1:1:1:1", hget(h, "x-enqueue"))

	// The consumer's instance is replaced after a fault; the queue and its registration
	// survive and the new VM is notified.
	cf := &fixture{rt: rt, p: consumer}
	res, _ := cf.op(t, "trap")
	require.NotNil(t, res.Failure)
	_, h = pf.op(t, "enqueue", [2]string{"x-vm-id", "q-vm"})
	assert.Equal(t, "0:0:1:1", hget(h, "x-enqueue"))
	eventually(t, &logs.notify, func() bool {
		m, _ := consumer.Metrics().Get("queue_items_total", MetricCounter)
		return m.Value == 4
	}, "the replaced consumer drained the new item")
}
