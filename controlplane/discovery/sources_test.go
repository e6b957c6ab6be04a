package discovery_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/source"
)

// scriptedSource publishes the configs it is given, one event at a time; it also offers the
// reads a source could be asked for (List, Get) and counts them, so a test can see that the
// control plane never reads a source back.
type scriptedSource struct {
	name   string
	events chan source.ConfigEvent
	held   map[config.Key]*config.Config
	reads  atomic.Int64
}

func (s *scriptedSource) Name() string { return s.name }

func (s *scriptedSource) Run(ctx context.Context, sink source.Sink) error {
	sink.Synced(s.name)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-s.events:
			for _, c := range ev.Updated {
				s.held[c.Key()] = c
			}
			sink.Configs(s.name, ev)
		}
	}
}

func (s *scriptedSource) List() []*config.Config {
	s.reads.Add(1)
	var out []*config.Config
	for _, c := range s.held {
		out = append(out, c)
	}
	return out
}

func (s *scriptedSource) Get(k config.Key) *config.Config {
	s.reads.Add(1)
	return s.held[k]
}

// A change a source publishes reaches the proxies through its event alone: the source is not
// read back, and the services it defines come with it; the directory's version of a key wins
// over another source's.
func TestSourcesPublishAndAreNeverReadBack(t *testing.T) {
	src := &scriptedSource{name: "scripted", events: make(chan source.ConfigEvent, 4), held: map[config.Key]*config.Config{}}
	e := start(t, map[string]string{"services.yaml": services}, func(o *discovery.Options) { o.Sources = []source.Source{src} })
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.ClusterType, backendCluster))

	extra := parseOne(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec:
  hosts: [extra.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 9090, name: http}]
  endpoints: [{address: 10.7.0.1}]
`)
	src.events <- source.ConfigEvent{Updated: []*config.Config{extra}}
	wait(t, fe, has(adsc.ClusterType, "outbound|9090||extra.demo.svc.cluster.local"))
	wait(t, fe, hasEndpointIP("outbound|9090||extra.demo.svc.cluster.local", "10.7.0.1"))

	// The directory defines backend; the source's backend (another port) is not in force.
	shadow := parseOne(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: demo}
spec:
  hosts: [backend.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 7777, name: http}]
`)
	src.events <- source.ConfigEvent{Updated: []*config.Config{shadow}}
	src.events <- source.ConfigEvent{Deleted: []config.Key{extra.Key()}}
	wait(t, fe, func(c *adsc.Client) bool {
		return !has(adsc.ClusterType, "outbound|9090||extra.demo.svc.cluster.local")(c)
	})
	assert.NotContains(t, fe.Names(adsc.ClusterType), "outbound|7777||backend.demo.svc.cluster.local")
	assert.Equal(t, map[config.Key]string{shadow.Key(): "configDir"}, e.d.State.Shadowed())
	assert.Zero(t, src.reads.Load(), "the source is never read back")
}

func parseOne(t *testing.T, yaml string) *config.Config {
	t.Helper()
	docs := config.ParseFile("test.yaml", []byte(yaml))
	require.Len(t, docs, 1)
	require.Nil(t, docs[0].Err)
	return docs[0].Config
}
