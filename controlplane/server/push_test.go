package server_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/server"
)

// SotW: a cluster that CDS replaces is warmed again by Envoy, which waits for its endpoints,
// so the push sends its assignment too even though its endpoints did not change (Istio
// pushes EDS after CDS alike), and only its.
func TestAReplacedClusterGetsItsEndpointsAgain(t *testing.T) {
	m := newMesh(t)
	p, got := m.connect(1, false)
	m.writeConfig("dr.yaml", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: frontend, namespace: demo}
spec: {host: frontend.demo.svc.cluster.local, trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}}
`)
	cds := expect(p, cdsType, latest, meshClusters, nil)
	assert.NotEqual(t, got[cdsType].msgs[frontendCluster], cds.msgs[frontendCluster], "the frontend cluster changed")
	eds := expect(p, edsType, cds.version, []string{frontendCluster}, nil)
	assert.Equal(t, endpointIPs(got[edsType], frontendCluster), endpointIPs(eds, frontendCluster))
	// Nothing else was sent: the next response is the one a later endpoint change causes.
	m.setWorkload("backend", "backend-2", "127.10.0.4")
	expect(p, edsType, latest, []string{backendCluster}, nil)
}

// Every push a proxy gets counts toward pilot_proxy_convergence_time, endpoints-only ones
// too.
func TestEveryPushCountsTowardConvergence(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, _ := m.connect(1, delta)
		pushes := func() uint64 {
			var out dto.Metric
			require.NoError(t, m.metrics.ConvergenceTime.Write(&out))
			return out.GetHistogram().GetSampleCount()
		}
		before := pushes()
		m.setWorkload("frontend", "frontend-2", "127.10.0.3")
		expect(p, edsType, latest, []string{frontendCluster}, nil)
		require.Eventually(t, func() bool { return pushes() == before+1 }, waitFor, time.Millisecond)
		m.writeConfig("extra.yaml", extraYAML)
		p.ack(p.nextOf(cdsType))
		require.Eventually(t, func() bool { return pushes() == before+2 }, waitFor, time.Millisecond)
	})
}

// A proxy held after a restart (it resumed with its config in the reconnect window) misses
// the pushes of the window, endpoints-only ones too: it gets nothing until the window ends.
func TestAHeldProxyGetsNoPushes(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t, func(o *server.Options) { o.ReconnectWindow = time.Hour })
		p := m.open(1, delta)
		if delta {
			p.raw(cdsType, "", nil, nil, nil, map[string]string{frontendCluster: "1"})
		} else {
			p.acked[cdsType] = "v0" // the version it had
			p.want(cdsType)
		}
		p.want(edsType, frontendCluster)
		m.waitSyncz(p.id, "EDS watched", func(st map[string]server.TypeStatus) bool { return st["eds"].Subscribed == 1 })
		settled := func() bool { return m.pusher.Settled() && m.srv.Idle() }
		m.setWorkload("frontend", "frontend-2", "127.10.0.3") // an endpoints-only push
		require.Eventually(t, settled, waitFor, time.Millisecond)
		m.writeConfig("extra.yaml", extraYAML) // a full push
		require.Eventually(t, settled, waitFor, time.Millisecond)
		st := m.syncz(p.id)
		assert.Zero(t, st["cds"].Sent)
		assert.Zero(t, st["eds"].Sent)
	})
}
