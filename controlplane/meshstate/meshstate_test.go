package meshstate

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/metrics"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

func newState(t *testing.T, sources ...string) (*State, *[]*push.Request) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var pushed []*push.Request
	s := New(log, registry.NewServiceEntries(log, metrics.New(prometheus.NewRegistry())),
		func(r *push.Request) { pushed = append(pushed, r) }, sources...)
	return s, &pushed
}

func vs(name, host string) *config.Config {
	docs := config.ParseFile(name+".yaml", []byte(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: `+name+`, namespace: demo}
spec: {hosts: [`+host+`], http: [{route: [{destination: {host: `+host+`}}]}]}
`))
	if docs[0].Err != nil {
		panic(docs[0].Err)
	}
	return docs[0].Config
}

// For one key, the source listed first is in force; the other's version takes over when it
// lets go, and only changes in force are pushed.
func TestConfigsMergeByPrecedence(t *testing.T) {
	s, pushed := newState(t, "dir", "kube")
	s.Synced("dir")
	s.Synced("kube")
	dirV, kubeV, other := vs("r", "a"), vs("r", "b"), vs("other", "c")

	s.Configs("kube", source.ConfigEvent{Updated: []*config.Config{kubeV, other}})
	assert.Equal(t, []*config.Config{other, kubeV}, s.List())
	s.Configs("dir", source.ConfigEvent{Updated: []*config.Config{dirV}})
	assert.Equal(t, []*config.Config{other, dirV}, s.List(), "the first source wins")
	assert.Equal(t, map[config.Key]string{kubeV.Key(): "dir"}, s.Shadowed())

	n := len(*pushed)
	s.Configs("kube", source.ConfigEvent{Updated: []*config.Config{vs("r", "d")}})
	assert.Len(t, *pushed, n, "a change of a version not in force pushes nothing")

	s.Configs("dir", source.ConfigEvent{Deleted: []config.Key{dirV.Key()}})
	require.Len(t, s.List(), 2)
	assert.Equal(t, "d", s.List()[1].Spec.(interface{ GetHosts() []string }).GetHosts()[0], "the other source's version takes over")
	last := (*pushed)[len(*pushed)-1]
	assert.True(t, last.Full)
	assert.Contains(t, last.ConfigsUpdated, dirV.Key())

	s.Configs("kube", source.ConfigEvent{Deleted: []config.Key{dirV.Key(), other.Key()}})
	assert.Empty(t, s.List())
	assert.Empty(t, s.Shadowed())
}

// Nothing is pushed before every source has synced (the first snapshot is built from the
// whole state); readiness does not wait for the proxies.
func TestPushesStartOnceEverySourceSynced(t *testing.T) {
	s, pushed := newState(t, "dir", "kube", registry.ProxiesSource)
	s.Configs("dir", source.ConfigEvent{Updated: []*config.Config{vs("r", "a")}})
	s.Synced("dir")
	assert.False(t, s.Ready())
	s.Configs("kube", source.ConfigEvent{Updated: []*config.Config{vs("k", "b")}})
	assert.Empty(t, *pushed)
	s.Synced("kube")
	assert.True(t, s.Ready())
	assert.Len(t, s.List(), 2, "what came before is in the state")
	s.Configs("kube", source.ConfigEvent{Updated: []*config.Config{vs("k", "c")}})
	assert.Len(t, *pushed, 1)
}

// Workloads merge by precedence too, and the registry selects the one in force.
func TestWorkloadsMergeByPrecedence(t *testing.T) {
	s, _ := newState(t, "kube", registry.ProxiesSource)
	s.Synced("kube")
	pod := &model.Workload{Name: "w", Namespace: "demo", IPs: []string{"10.0.0.1"}}
	proxy := &model.Workload{Name: "w", Namespace: "demo", IPs: []string{"10.0.0.2"}}
	s.Workloads(registry.ProxiesSource, source.WorkloadEvent{Updated: []*model.Workload{proxy}})
	require.Len(t, s.Entries.Workloads(), 1)
	assert.Equal(t, []string{"10.0.0.2"}, s.Entries.Workloads()[0].IPs)
	s.Workloads("kube", source.WorkloadEvent{Updated: []*model.Workload{pod}})
	assert.Equal(t, []string{"10.0.0.1"}, s.Entries.Workloads()[0].IPs, "the pod wins over the proxy's registration")
	s.Workloads("kube", source.WorkloadEvent{Deleted: []string{"demo/w"}})
	assert.Equal(t, []string{"10.0.0.2"}, s.Entries.Workloads()[0].IPs)
	s.Workloads(registry.ProxiesSource, source.WorkloadEvent{Deleted: []string{"demo/w"}})
	assert.Empty(t, s.Entries.Workloads())
}

// Services and endpoints a source publishes join the registry ahead of the ServiceEntries:
// for a host both define, the source's service is in force. Saying the same again pushes
// nothing; new endpoints push endpoints only.
func TestPublishedServicesWinAndRepeatsPushNothing(t *testing.T) {
	s, pushed := newState(t, "kube")
	s.Synced("kube")
	se := config.ParseFile("se.yaml", []byte(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec: {hosts: [web.demo.svc.cluster.local], resolution: STATIC, ports: [{number: 80, name: http}]}
`))[0].Config
	s.Configs("kube", source.ConfigEvent{Updated: []*config.Config{se}})
	require.Len(t, s.Registry.Services(), 1)
	assert.Equal(t, uint32(80), s.Registry.Services()[0].Ports[0].Port)

	svc := &model.Service{Hostname: "web.demo.svc.cluster.local", Namespace: "demo", Name: "web", Ports: []model.Port{{Name: "http", Port: 8080}}}
	n := len(*pushed)
	s.Services("kube", source.ServiceEvent{Updated: []*model.Service{svc}})
	require.Len(t, s.Registry.Services(), 1)
	assert.Equal(t, uint32(8080), s.Registry.Services()[0].Ports[0].Port, "the published service wins")
	require.Len(t, *pushed, n+1)
	assert.True(t, (*pushed)[n].Full)

	again := *svc
	s.Services("kube", source.ServiceEvent{Updated: []*model.Service{&again}})
	eps := []*model.Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 8080}}
	s.Endpoints("kube", source.EndpointEvent{Host: svc.Hostname, Endpoints: eps})
	s.Endpoints("kube", source.EndpointEvent{Host: svc.Hostname, Endpoints: []*model.Endpoint{{Address: "10.0.0.1", Port: 8080, ServicePort: 8080}}})
	require.Len(t, *pushed, n+2, "a relist says nothing new")
	assert.False(t, (*pushed)[n+1].Full)
	assert.Equal(t, map[string]struct{}{svc.Hostname: {}}, (*pushed)[n+1].EDSHosts)
	assert.Equal(t, eps, s.Registry.Endpoints(svc.Hostname))

	s.Services("kube", source.ServiceEvent{Deleted: []string{svc.Hostname}})
	assert.Equal(t, uint32(80), s.Registry.Services()[0].Ports[0].Port, "the ServiceEntry's takes over")
}
