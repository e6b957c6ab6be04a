package server_test

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/server"
)

// latest stands for the version of the snapshot in force once the response has come.
const latest = "latest"

// expect reads a proxy's next response and requires it to be typ at version (or latest)
// with these resources and removals; it ACKs it.
func expect(p *proxy, typ, version string, names, removed []string) response {
	p.t.Helper()
	r := p.nextOf(typ)
	if version == latest {
		version = p.latest()
	}
	assert.Equal(p.t, version, r.version, "%s %s version", p.id, short(typ))
	assert.Equal(p.t, names, r.names, "%s %s resources", p.id, short(typ))
	assert.Equal(p.t, removed, r.removed, "%s %s removed", p.id, short(typ))
	p.ack(r)
	return r
}

// pick returns the delta or the SotW expectation.
func pick(delta bool, d, sotw []string) []string {
	if delta {
		return d
	}
	return sotw
}

// An endpoints-only change sends only EDS, only the changed clusters, and only to the
// proxies that watch them; a config change sends the changed types to every proxy, each
// only the types it watches. Each step's responses are read before the next step, so a
// response a proxy should not have got shows up in place of the next one expected.
func TestEndpointsOnlyChangeSendsOnlyEDSToWatchers(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		all, _ := m.connect(1, delta) // watches both clusters' endpoints, listeners and routes
		be := m.open(2, delta)        // watches the clusters and the backend's endpoints
		be.want(cdsType)
		be.ack(be.nextOf(cdsType))
		be.want(edsType, backendCluster)
		be.ack(be.nextOf(edsType))
		cdsOnly := m.open(3, delta) // watches the clusters only
		cdsOnly.want(cdsType)
		cdsOnly.ack(cdsOnly.nextOf(cdsType))

		// 1. A frontend workload comes: EDS of the frontend cluster, to its one watcher.
		m.setWorkload("frontend", "frontend-2", "127.10.0.3")
		eds := all.nextOf(edsType)
		all.ack(eds)
		status := m.pusher.Status()
		assert.False(t, status.Full, "an endpoints-only push")
		assert.Equal(t, status.Version, eds.version)
		assert.Equal(t, []string{frontendCluster}, eds.names)
		assert.Equal(t, []string{"127.10.0.1", "127.10.0.3"}, endpointIPs(eds, frontendCluster))

		// 2. A service comes: a full push, CDS to all, LDS to the proxy that watches it.
		m.writeConfig("extra.yaml", extraYAML)
		v := all.ack(all.nextOf(cdsType)).version
		require.True(t, m.pusher.Status().Full, "the next CDS (%s) is the config change's full push", v)
		require.NotEqual(t, eds.version, v)
		withExtra := []string{"BlackHoleCluster", "PassthroughCluster", frontendCluster, backendCluster, extraCluster}
		expect(all, ldsType, v, pick(delta, []string{listenerName(1, 9082)}, []string{listenerName(1, 9080), listenerName(1, 9081), listenerName(1, 9082)}), nil)
		expect(be, cdsType, v, pick(delta, []string{extraCluster}, withExtra), nil)
		expect(cdsOnly, cdsType, v, pick(delta, []string{extraCluster}, withExtra), nil)

		// 3. A backend workload comes: EDS of the backend cluster, to its two watchers.
		m.setWorkload("backend", "backend-2", "127.10.0.4")
		eds = all.nextOf(edsType)
		all.ack(eds)
		assert.Equal(t, []string{backendCluster}, eds.names)
		assert.Equal(t, []string{"127.10.0.2", "127.10.0.4"}, endpointIPs(eds, backendCluster))
		beEDS := expect(be, edsType, eds.version, []string{backendCluster}, nil)
		assert.Equal(t, []string{"127.10.0.2", "127.10.0.4"}, endpointIPs(beEDS, backendCluster))

		// 4. The service goes: the barrier for the proxy that watches no endpoints.
		m.removeConfig("extra.yaml")
		v = all.ack(all.nextOf(cdsType)).version
		expect(all, ldsType, v, pick(delta, nil, []string{listenerName(1, 9080), listenerName(1, 9081)}), pick(delta, []string{listenerName(1, 9082)}, nil))
		expect(be, cdsType, v, pick(delta, nil, meshClusters), pick(delta, []string{extraCluster}, nil))
		expect(cdsOnly, cdsType, v, pick(delta, nil, meshClusters), pick(delta, []string{extraCluster}, nil))

		// The server's own count of what it sent agrees.
		m.waitSyncz(be.id, "3 CDS and 2 EDS sent", func(st map[string]server.TypeStatus) bool {
			return st["cds"].Sent == 3 && st["eds"].Sent == 2 && len(st) == 2
		})
		m.waitSyncz(cdsOnly.id, "3 CDS sent", func(st map[string]server.TypeStatus) bool {
			return st["cds"].Sent == 3 && len(st) == 1
		})
		m.waitSyncz(all.id, "3 CDS, 3 EDS, 3 LDS and 1 RDS sent", func(st map[string]server.TypeStatus) bool {
			return st["cds"].Sent == 3 && st["eds"].Sent == 3 && st["lds"].Sent == 3 && st["rds"].Sent == 1
		})
	})
}

// A request whose nonce is not the latest response's answers a response that is no longer
// current: it is ignored, not taken as an ACK, a NACK or (SotW) a new subscription, and not
// answered, and the server counts it (pilot_xds_expired_nonce). A current request sent after
// them tells when the server has handled them; a later push shows that the subscription
// stayed as it was and that they got no response.
func TestStaleNonceIsIgnored(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, got := m.connect(1, delta)
		old := got[edsType]
		m.setWorkload("frontend", "frontend-2", "127.10.0.3")
		cur := p.nextOf(edsType)
		p.ack(cur)
		m.waitAcked(p.id, cur)
		expired := func() float64 { return testutil.ToFloat64(m.metrics.ExpiredNonce.WithLabelValues("eds")) }
		before := expired()

		p.raw(edsType, old.nonce, p.resent(edsType), nil, nack("stale rejection"), nil)
		p.raw(edsType, old.nonce, p.resent(edsType), nil, nil, nil)
		stale := 2.0
		if !delta {
			// A SotW subscription change with the old nonce: dropping the backend cluster.
			p.raw(edsType, old.nonce, []string{frontendCluster}, nil, nil, nil)
			stale++
		}
		// A current request after them: once the server has recorded it, it has handled them.
		p.ack(got[rdsType])
		st := m.waitSyncz(p.id, "the later RDS ACK", func(st map[string]server.TypeStatus) bool { return st["rds"].Acks == 2 })["eds"]
		assert.Equal(t, before+stale, expired(), "stale requests counted")
		assert.Zero(t, st.Nacks)
		assert.Empty(t, st.NackError)
		assert.Empty(t, st.VersionNacked)
		assert.Equal(t, 2, st.Acks)
		assert.True(t, ackedAs(st, cur), "eds: %+v", st)
		assert.Equal(t, 2, st.Subscribed)

		// The next response is the push of a backend change: the stale requests got none,
		// and the backend cluster is still watched.
		m.setWorkload("backend", "backend-2", "127.10.0.4")
		r := p.nextOf(edsType)
		assert.Equal(t, []string{backendCluster}, r.names)
	})
}

// Delta: EDS is subscribed and unsubscribed by name; a new name gets only its resource, a
// dropped name gets no more updates.
func TestDeltaSubscribeAndUnsubscribeEndpoints(t *testing.T) {
	m := newMesh(t)
	p := m.open(1, true)
	p.want(cdsType)
	p.ack(p.nextOf(cdsType))
	p.want(edsType, frontendCluster)
	first := expect(p, edsType, latest, []string{frontendCluster}, nil)
	p.want(edsType, frontendCluster, backendCluster)
	expect(p, edsType, first.version, []string{backendCluster}, nil)
	p.want(edsType, backendCluster)
	m.waitSyncz(p.id, "one EDS name subscribed", func(st map[string]server.TypeStatus) bool { return st["eds"].Subscribed == 1 })

	// Another proxy watching the frontend sees its change; this one does not.
	fe := m.open(2, true)
	fe.want(cdsType)
	fe.ack(fe.nextOf(cdsType))
	fe.want(edsType, frontendCluster)
	fe.ack(fe.nextOf(edsType))
	m.setWorkload("frontend", "frontend-2", "127.10.0.3")
	expect(fe, edsType, latest, []string{frontendCluster}, nil)
	m.setWorkload("backend", "backend-2", "127.10.0.4")
	r := expect(p, edsType, latest, []string{backendCluster}, nil)
	assert.Equal(t, []string{"127.10.0.2", "127.10.0.4"}, endpointIPs(r, backendCluster))

	// A delta request is a change, not a restatement: a subscription it makes counts even
	// with an old nonce (ignoring it would lose the name for good). Only its ACK is stale.
	p.raw(edsType, first.nonce, []string{frontendCluster}, nil, nil, nil)
	again := expect(p, edsType, latest, []string{frontendCluster}, nil)
	assert.Equal(t, []string{"127.10.0.1", "127.10.0.3"}, endpointIPs(again, frontendCluster))
	st := m.waitAcked(p.id, again)
	assert.Equal(t, 2, st["eds"].Subscribed)
}

// Delta: a proxy that reconnects saying which versions it has (initial_resource_versions)
// gets only what differs: nothing for resources at the same version (an empty answer where
// Envoy waits for one: the wildcard types), the resource whose version differs, and the
// removal of a name the server no longer has.
func TestDeltaReconnectSendsOnlyWhatDiffers(t *testing.T) {
	m := newMesh(t)
	p, got := m.connect(1, true)
	p.close()
	m.waitGone(p.id)

	q := m.open(1, true)
	q.raw(cdsType, "", nil, nil, nil, got[cdsType].versions)
	expect(q, cdsType, latest, nil, nil)
	q.raw(edsType, "", got[edsType].names, nil, nil, got[edsType].versions)
	q.raw(ldsType, "", nil, nil, nil, got[ldsType].versions)
	expect(q, ldsType, latest, nil, nil)
	q.raw(rdsType, "", got[rdsType].names, nil, nil, got[rdsType].versions)
	m.waitSyncz(q.id, "EDS and RDS subscribed", func(st map[string]server.TypeStatus) bool {
		return st["eds"].Subscribed == 2 && st["rds"].Subscribed == 2
	})
	// Nothing was sent for EDS and RDS: the next response is the push of an endpoint change.
	m.setWorkload("frontend", "frontend-2", "127.10.0.3")
	expect(q, edsType, latest, []string{frontendCluster}, nil)
	q.close()
	m.waitGone(q.id)

	const gone = "outbound|9999||gone.demo.svc.cluster.local"
	versions := maps.Clone(got[cdsType].versions)
	versions[frontendCluster] = "0"
	versions[gone] = "1"
	r := m.open(1, true)
	r.raw(cdsType, "", nil, nil, nil, versions)
	cds := expect(r, cdsType, latest, []string{frontendCluster}, []string{gone})
	assert.Equal(t, got[cdsType].versions[frontendCluster], cds.versions[frontendCluster])
}

// A service that goes leaves every type: delta names it in removed_resources of CDS, EDS,
// LDS and RDS; SotW sends the clusters and listeners without it. The proxy then drops the
// names from its subscriptions, as Envoy does, and gets nothing for that.
func TestRemovedServiceLeavesEveryType(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, _ := m.connect(1, delta)
		m.removeConfig("backend.yaml")
		v := p.nextOf(cdsType).version
		if delta {
			expect(p, edsType, v, nil, []string{backendCluster})
			expect(p, ldsType, v, nil, []string{listenerName(1, 9081)})
			expect(p, rdsType, v, nil, []string{"9081"})
		} else {
			expect(p, ldsType, v, []string{listenerName(1, 9080)}, nil)
		}
		st := m.syncz(p.id)
		assert.Equal(t, 3, st["cds"].Resources)
		p.want(edsType, frontendCluster)
		p.want(rdsType, "9080")
		m.waitSyncz(p.id, "the names dropped", func(st map[string]server.TypeStatus) bool {
			return st["eds"].Subscribed == 1 && st["rds"].Subscribed == 1
		})
		m.setWorkload("frontend", "frontend-2", "127.10.0.3")
		expect(p, edsType, latest, []string{frontendCluster}, nil)
	})
}
