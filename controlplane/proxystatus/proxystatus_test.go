package proxystatus

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/debug"
	"github.com/wasmesh/wasmesh/controlplane/server"
)

// A type's status from what discovery sent and what the proxy answered.
func TestState(t *testing.T) {
	for _, c := range []struct {
		name string
		in   server.TypeStatus
		want TypeState
	}{
		{"nothing sent", server.TypeStatus{Type: "cds"}, TypeState{Type: "cds", Status: NotSent}},
		{"latest acked", server.TypeStatus{Type: "lds", NonceSent: "n2", VersionSent: "v2", NonceAcked: "n2", VersionAcked: "v2"},
			TypeState{Type: "lds", Status: Synced, VersionSent: "v2", VersionAcked: "v2"}},
		{"sent, no answer yet", server.TypeStatus{Type: "lds", NonceSent: "n3", VersionSent: "v3", NonceAcked: "n2", VersionAcked: "v2"},
			TypeState{Type: "lds", Status: Stale, VersionSent: "v3", VersionAcked: "v2"}},
		{"NACKed", server.TypeStatus{Type: "lds", NonceSent: "n3", VersionSent: "v3", NonceAcked: "n2", VersionAcked: "v2",
			VersionNacked: "v3", NackError: "bad filter"},
			TypeState{Type: "lds", Status: Stale, VersionSent: "v3", VersionAcked: "v2", NackError: "bad filter"}},
		{"an older NACK, a newer version sent", server.TypeStatus{Type: "lds", NonceSent: "n4", VersionSent: "v4", NonceAcked: "n2",
			VersionAcked: "v2", VersionNacked: "v3", NackError: "bad filter"},
			TypeState{Type: "lds", Status: Stale, VersionSent: "v4", VersionAcked: "v2"}},
	} {
		assert.Equal(t, c.want, State(c.in), c.name)
	}
	p := Proxy{SyncStatus: debug.SyncStatus{Types: []server.TypeStatus{{Type: "eds", NonceSent: "1", NonceAcked: "1"}}}}
	var got []string
	for _, s := range p.States() {
		got = append(got, s.Type+"="+s.Status)
	}
	assert.Equal(t, []string{"cds=NOT SENT", "lds=NOT SENT", "eds=SYNCED", "rds=NOT SENT", "ecds=NOT SENT"}, got)
}

func proxy(name, ns, replica string, types ...server.TypeStatus) Proxy {
	return Proxy{SyncStatus: debug.SyncStatus{ProxyID: "sidecar~10.0.0.1~" + name + "." + ns + "~" + ns + ".svc.cluster.local",
		Name: name, Namespace: ns, Discovery: replica, Types: types}, DiscoveryAddress: "10.0.0.9:15014"}
}

func TestFind(t *testing.T) {
	ps := []Proxy{proxy("web-1", "default", "d1"), proxy("web-1", "shop", "d1"), proxy("api-1", "shop", "d2")}
	p, err := Find(ps, "web-1")
	require.NoError(t, err)
	assert.Equal(t, "default", p.Namespace)
	p, err = Find(ps, "web-1.shop")
	require.NoError(t, err)
	assert.Equal(t, "shop", p.Namespace)
	p, err = Find(ps, ps[2].ProxyID)
	require.NoError(t, err)
	assert.Equal(t, "api-1", p.Name)
	_, err = Find(ps, "db-1")
	assert.EqualError(t, err, `no proxy of pod "db-1" is connected to discovery (connected: web-1.default, web-1.shop, api-1.shop)`)
	_, err = Find(append(ps, proxy("api-1", "shop", "d3")), "api-1.shop")
	assert.ErrorContains(t, err, `pod "api-1.shop" has 2 connections`)
}

func TestTables(t *testing.T) {
	nacked := server.TypeStatus{Type: "lds", NonceSent: "n3", VersionSent: "v3", NonceAcked: "n2", VersionAcked: "v2",
		VersionNacked: "v3", NackError: "listener 10.0.0.1_8080: bad filter"}
	synced := server.TypeStatus{Type: "cds", NonceSent: "n1", VersionSent: "v1", NonceAcked: "n1", VersionAcked: "v1"}
	rows := Rows([]Proxy{proxy("web-1", "default", "discovery-a", synced, nacked)})
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, rows))
	assert.Equal(t, `NAME            CLUSTER   CDS      LDS            EDS        RDS        ECDS       DISCOVERY     VERSION
web-1.default   -         SYNCED   STALE (NACK)   NOT SENT   NOT SENT   NOT SENT   discovery-a   -

Rejected by the proxy (NACK); it keeps its last accepted config:
  web-1.default LDS version v3: listener 10.0.0.1_8080: bad filter
`, b.String())

	r := rows[0]
	r.Compare(map[string]string{"cds": "v1", "lds": "v2"})
	b.Reset()
	require.NoError(t, WriteDetail(&b, r))
	out := b.String()
	assert.Contains(t, out, "CDS    SYNCED         v1     v1      MATCHES ACKED   v1\n")
	assert.Contains(t, out, "LDS    STALE (NACK)   v3     v2      MATCHES ACKED   v2\n")
	assert.Contains(t, out, "EDS    NOT SENT       -      -       -               -\n")
	r.Compare(map[string]string{"cds": "v0"})
	assert.Equal(t, map[string]bool{"cds": false, "lds": false, "eds": true, "rds": true, "ecds": true}, r.Match)
}

// The resources discovery generates for a proxy against those it holds, by name.
func TestCompareResources(t *testing.T) {
	r := Rows([]Proxy{proxy("web-1", "default", "d")})[0]
	r.CompareResources(map[string][]string{"cds": {"a", "b", "c"}, "lds": {"x"}}, map[string][]string{"cds": {"c", "a", "z"}, "lds": {"x"}})
	assert.Equal(t, Diff{Same: 2, Missing: []string{"b"}, Extra: []string{"z"}}, r.Resources["cds"])
	assert.Equal(t, "1 same", r.Resources["lds"].String())
	assert.Equal(t, "0 same", r.Resources["eds"].String())
	var b bytes.Buffer
	require.NoError(t, WriteDetail(&b, r))
	assert.Contains(t, b.String(), "CDS    NOT SENT   -      -       2 same, 1 missing, 1 extra\n")
	assert.Contains(t, b.String(), "\nResources that differ:\n  CDS the proxy lacks: b\n  CDS the proxy has that discovery would not send: z\n")
}

// Every replica must answer: a table missing one replica's proxies would mislead.
func TestFetchNamesTheReplicaThatDoesNotAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := l.Addr().String()
	require.NoError(t, l.Close())
	c := &http.Client{Timeout: 2 * time.Second}
	_, err = Fetch(context.Background(), c, []string{down})
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "discovery "+down+": "), err.Error())
	_, err = Fetch(context.Background(), c, []string{"10.0.0.1:15014/debug"})
	assert.EqualError(t, err, `discovery address "10.0.0.1:15014/debug": want host:port or an http(s) URL`)
}
