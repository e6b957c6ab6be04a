package server_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/server"
)

// The clusters every proxy of the small mesh gets, sorted.
var meshClusters = []string{"BlackHoleCluster", "PassthroughCluster", frontendCluster, backendCluster}

// waitSyncz waits until what /debug/syncz shows of a proxy satisfies cond, and returns it.
func (m *testMesh) waitSyncz(id, what string, cond func(map[string]server.TypeStatus) bool) map[string]server.TypeStatus {
	m.t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitFor)
	for {
		st := m.syncz(id)
		if st != nil && cond(st) {
			return st
		}
		select {
		case <-tick.C:
		case <-deadline:
			m.t.Fatalf("syncz of %s never showed %s; it shows %+v", id, what, st)
		}
	}
}

// waitGone waits until /debug/syncz no longer shows the proxy.
func (m *testMesh) waitGone(id string) {
	m.t.Helper()
	require.Eventually(m.t, func() bool { return m.syncz(id) == nil }, waitFor, 2*time.Millisecond, "%s still connected", id)
}

// ackedAs reports whether a type's sync state is the ACK of r: the response sent last,
// accepted, and no rejection pending.
func ackedAs(st server.TypeStatus, r response) bool {
	return st.NonceSent == r.nonce && st.VersionSent == r.version && st.NonceAcked == r.nonce && st.VersionAcked == r.version &&
		st.NackError == ""
}

// waitAcked waits until syncz shows each response as the last one sent and ACKed.
func (m *testMesh) waitAcked(id string, rs ...response) map[string]server.TypeStatus {
	m.t.Helper()
	return m.waitSyncz(id, fmt.Sprintf("%d responses ACKed", len(rs)), func(st map[string]server.TypeStatus) bool {
		for _, r := range rs {
			if !ackedAs(st[short(r.typ)], r) {
				return false
			}
		}
		return true
	})
}

func short(typ string) string {
	return map[string]string{cdsType: "cds", edsType: "eds", ldsType: "lds", rdsType: "rds"}[typ]
}

// A proxy subscribing in Envoy's order gets, for each type, the resources of its mesh under
// the type's URL, each valid, with a fresh nonce and the snapshot's version.
func TestInitialSubscriptionInEnvoyOrder(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		_, got := m.connect(1, delta)
		version := m.pusher.Status().Version
		require.NotEmpty(t, version)
		want := map[string][]string{
			cdsType: meshClusters,
			edsType: {frontendCluster, backendCluster},
			ldsType: {listenerName(1, 9080), listenerName(1, 9081)},
			rdsType: {"9080", "9081"},
		}
		nonces := map[string]string{}
		for typ, names := range want {
			r := got[typ]
			assert.Equal(t, typ, r.typ)
			assert.Equal(t, names, r.names, "%s resources", short(typ))
			assert.Empty(t, r.removed, "%s removed", short(typ))
			assert.Equal(t, version, r.version, "%s version", short(typ))
			require.NotEmpty(t, r.nonce, "%s nonce", short(typ))
			assert.NotContains(t, nonces, r.nonce, "%s reuses the nonce of %s", short(typ), short(nonces[r.nonce]))
			nonces[r.nonce] = typ
		}
		assert.Equal(t, []string{"127.10.0.1"}, endpointIPs(got[edsType], frontendCluster))
		assert.Equal(t, []string{"127.10.0.2"}, endpointIPs(got[edsType], backendCluster))
	})
}

// An ACK is recorded as the accepted version and nonce of its type, for the first
// responses and for a push.
func TestAckIsRecorded(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, got := m.connect(1, delta)
		st := m.waitAcked(p.id, got[cdsType], got[edsType], got[ldsType], got[rdsType])
		for _, typ := range []string{"cds", "eds", "lds", "rds"} {
			assert.Equal(t, 1, st[typ].Sent, typ)
			assert.Equal(t, 1, st[typ].Acks, typ)
			assert.Zero(t, st[typ].Nacks, typ)
			assert.Empty(t, st[typ].VersionNacked, typ)
		}

		m.writeConfig("extra.yaml", extraYAML)
		cds := p.nextOf(cdsType)
		lds := p.nextOf(ldsType)
		require.NotEqual(t, got[cdsType].version, cds.version)
		p.ack(cds)
		p.ack(lds)
		st = m.waitAcked(p.id, cds, lds)
		assert.Equal(t, 2, st["cds"].Acks)
		assert.Equal(t, 2, st["lds"].Acks)
		// Types the push did not change keep their first ACK.
		assert.True(t, ackedAs(st["eds"], got[edsType]), "eds: %+v", st["eds"])
		assert.True(t, ackedAs(st["rds"], got[rdsType]), "rds: %+v", st["rds"])
	})
}

// A NACK (the response's nonce with error_detail) is recorded as a rejection: the error and
// the rejected version are shown, the accepted version stays the one before, nothing is
// counted as an ACK, and the rejected config is not sent again.
func TestNackIsRecordedAsNack(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, got := m.connect(1, delta)
		m.waitAcked(p.id, got[cdsType], got[edsType], got[ldsType], got[rdsType])

		m.writeConfig("extra.yaml", extraYAML)
		cds := p.nextOf(cdsType)
		require.Contains(t, cds.names, extraCluster)
		const reason = "cluster outbound|9082||extra.demo.svc.cluster.local: rejected by the test"
		p.nack(cds, reason)
		lds := p.nextOf(ldsType)
		p.ack(lds)

		// The LDS ACK went after the NACK on the stream: once it is recorded, so is the NACK.
		st := m.waitAcked(p.id, lds)
		c := st["cds"]
		assert.Equal(t, 1, c.Nacks, "cds NACKs")
		assert.Equal(t, reason, c.NackError)
		assert.Equal(t, cds.version, c.VersionNacked, "the rejected version")
		assert.Equal(t, got[cdsType].version, c.VersionAcked, "the accepted version stays the one before")
		assert.Equal(t, got[cdsType].nonce, c.NonceAcked, "the accepted nonce stays the one before")
		assert.Equal(t, 1, c.Acks, "cds ACKs: only the first response")
		assert.Equal(t, cds.nonce, c.NonceSent)
		assert.Equal(t, 2, c.Sent)
		assert.Equal(t, 1.0, testutil.ToFloat64(m.metrics.Rejects.WithLabelValues("cds")))
		assert.Zero(t, testutil.ToFloat64(m.metrics.Rejects.WithLabelValues("lds")))

		// The rejected clusters are not sent again: the next response the proxy gets is the
		// one a later endpoint change causes.
		m.setWorkload("frontend", "frontend-2", "127.10.0.3")
		eds := p.nextOf(edsType)
		assert.Equal(t, []string{frontendCluster}, eds.names)
		st = m.syncz(p.id)
		assert.Equal(t, 2, st["cds"].Sent, "CDS sends after the NACK")
		assert.Equal(t, reason, st["cds"].NackError)
	})
}

// A rejection is logged as a warning once per distinct error: a proxy that keeps rejecting
// every version with the same error adds no warning, a new error does.
func TestNackWarningsAreLoggedOncePerError(t *testing.T) {
	m := newMesh(t)
	p, got := m.connect(1, false)
	m.waitAcked(p.id, got[cdsType], got[edsType], got[ldsType], got[rdsType])
	nack := func(n int, reason string) {
		p.nack(p.nextOf(cdsType), reason)
		m.waitAcked(p.id, p.ack(p.nextOf(ldsType)))
		require.Equal(t, n, m.syncz(p.id)["cds"].Nacks)
	}
	const warning = "proxy rejected config"
	m.writeConfig("extra.yaml", extraYAML)
	nack(1, "rejected")
	m.writeConfig("extra.yaml", strings.Replace(extraYAML, "9082", "9083", 1))
	nack(2, "rejected")
	assert.Equal(t, 1, m.warnings.count(warning), "the same error again")
	m.removeConfig("extra.yaml")
	nack(3, "rejected otherwise")
	assert.Equal(t, 2, m.warnings.count(warning), "a new error")
}

// After a NACK, the next response the proxy accepts is recorded as accepted: the rejection
// does not stick to the type's bookkeeping.
func TestAckAfterNackMovesTheAcceptedVersion(t *testing.T) {
	forBoth(t, func(t *testing.T, delta bool) {
		m := newMesh(t)
		p, got := m.connect(1, delta)
		m.writeConfig("extra.yaml", extraYAML)
		cds := p.nextOf(cdsType)
		p.nack(cds, "rejected")
		m.waitAcked(p.id, p.ack(p.nextOf(ldsType)))
		require.Equal(t, 1, m.syncz(p.id)["cds"].Nacks)

		// The operator takes the change back: the next CDS is accepted.
		m.removeConfig("extra.yaml")
		fixed := p.nextOf(cdsType)
		if delta {
			assert.Equal(t, []string{extraCluster}, fixed.removed)
		} else {
			assert.Equal(t, meshClusters, fixed.names)
		}
		p.ack(fixed)
		p.ack(p.nextOf(ldsType))
		st := m.waitSyncz(p.id, "the fixed CDS ACKed", func(st map[string]server.TypeStatus) bool {
			return st["cds"].NonceAcked == fixed.nonce
		})
		c := st["cds"]
		assert.Equal(t, fixed.version, c.VersionAcked)
		assert.NotEqual(t, got[cdsType].version, c.VersionAcked)
		assert.Equal(t, fixed.nonce, c.NonceSent)
		assert.Equal(t, 2, c.Acks)
		assert.Equal(t, 1, c.Nacks)
		assert.Equal(t, cds.version, c.VersionNacked, "the rejected version stays on record")
		assert.Equal(t, "rejected", c.NackError, "and its error with it: a later version accepted does not clear it")
	})
}
