package pusher_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/pusher"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

const services = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a, namespace: demo}
spec: {hosts: [a.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.1}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: b, namespace: demo}
spec: {hosts: [b.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: 10.0.0.2}]}
`

// recorder is a watcher that keeps the events it is handed.
type recorder struct {
	mu     sync.Mutex
	events []*pusher.Event
}

func (r *recorder) Push(ev *pusher.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *recorder) got() []*pusher.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pusher.Event(nil), r.events...)
}

type configs []*config.Config

func (c configs) List() []*config.Config { return c }

func proxy(t *testing.T, name string) *model.Proxy {
	meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "NAME": name})
	require.NoError(t, err)
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.9.0.1~" + name + ".demo~demo.svc.cluster.local", Metadata: meta})
	require.NoError(t, err)
	return p
}

// The pusher alone, with no server: a change reaches exactly the proxies it concerns, as
// events; what equal proxies get is generated once and shared.
func TestPusherDeliversToTheProxiesAChangeConcerns(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var cs configs
	for _, d := range config.ParseFile("services.yaml", []byte(services)) {
		require.Nil(t, d.Err)
		cs = append(cs, d.Config)
	}
	reg := registry.NewServiceEntries(log, metrics.New(prometheus.NewRegistry()))
	reg.SetConfigs(cs)
	p := pusher.New(log, metrics.New(prometheus.NewRegistry()), push.DebounceOptions{After: time.Millisecond, Max: time.Second, EnableEDS: true},
		pusher.Deps{Registry: registry.NewAggregate(reg), Configs: cs, Mesh: mesh.Default})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, p.Ready, 5*time.Second, time.Millisecond)

	const clusterA, clusterB = "outbound|80||a.demo.svc.cluster.local", "outbound|80||b.demo.svc.cluster.local"
	var ra, rb, rab recorder
	wa, wb, wab := p.Watch(proxy(t, "pa"), &ra), p.Watch(proxy(t, "pb"), &rb), p.Watch(proxy(t, "pab"), &rab)
	wa.Subscribe(xds.EndpointType, false, []string{clusterA})
	wb.Subscribe(xds.EndpointType, false, []string{clusterB})
	wab.Subscribe(xds.EndpointType, false, []string{clusterA, clusterB})
	settle := func() { require.Eventually(t, p.Settled, 5*time.Second, time.Millisecond) }

	p.ConfigUpdate(push.NewEDS(map[string]struct{}{"a.demo.svc.cluster.local": {}}))
	settle()
	assert.Len(t, ra.got(), 1)
	assert.Empty(t, rb.got(), "b's watcher does not watch a's cluster")
	require.Len(t, rab.got(), 1)
	ev := rab.got()[0]
	assert.False(t, ev.Full())
	assert.Equal(t, []string{clusterA}, ev.EDSClusters())

	p.ConfigUpdate(push.NewFull(push.ReasonMesh))
	settle()
	assert.Len(t, rb.got(), 1, "a change of anything else concerns everyone")

	// Proxies watching the same names share what is generated for them.
	wa2 := p.Watch(proxy(t, "pa2"), &recorder{})
	wa2.Subscribe(xds.EndpointType, false, []string{clusterA})
	one, v1 := wa.Resources(xds.EndpointType, nil)
	two, v2 := wa2.Resources(xds.EndpointType, nil)
	assert.Same(t, one, two)
	assert.Equal(t, v1, v2)
	assert.Equal(t, []string{clusterA}, one.Names())

	// A closed proxy gets nothing more.
	wa.Close()
	p.ConfigUpdate(push.NewEDS(map[string]struct{}{"a.demo.svc.cluster.local": {}}))
	settle()
	assert.Len(t, ra.got(), 2, "the two events before it")
	assert.Len(t, rab.got(), 3)
}
