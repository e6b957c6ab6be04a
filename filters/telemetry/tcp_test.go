//go:build !wasip1

package main

import (
	"maps"
	"strings"
	"testing"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// connection runs one TCP connection through the proxy: props set first, then the
// downstream sends down bytes and the upstream answers with each of up. It returns the
// connection's context id, still open.
func (p *proxy) connection(props map[string][]byte, down int, up ...int) uint32 {
	p.t.Helper()
	h := p.host
	for path, v := range props {
		require.NoError(p.t, h.SetProperty(strings.Split(path, "."), v))
	}
	id, action := h.InitializeConnection()
	require.Equal(p.t, types.ActionContinue, action)
	require.Equal(p.t, types.ActionContinue, h.CallOnDownstreamData(id, make([]byte, down)))
	for _, n := range up {
		require.Equal(p.t, types.ActionContinue, h.CallOnUpstreamData(id, make([]byte, n)))
	}
	return id
}

// tcpValues maps each TCP metric reported to its value, checking every one carries want.
func (p *proxy) tcpValues(want map[string]string) map[string]uint64 {
	p.t.Helper()
	got := map[string]uint64{}
	for _, s := range p.samples() {
		require.True(p.t, strings.HasPrefix(s.name, "istio_tcp_"), "only TCP metrics, got %s", s.name)
		assert.Equal(p.t, want, s.labels, s.name)
		got[s.name] = s.value
	}
	return got
}

func TestTCPConnectionOnTheServerSide(t *testing.T) {
	p := mustStart(t, `{"network": true}`, ratings, ratingsNodeID, inbound)
	id := p.connection(map[string][]byte{
		"cluster_name":                         []byte("inbound|27017||"),
		"connection.mtls":                      {1},
		"connection.uri_san_peer_certificate":  []byte(productpageSAN),
		"connection.uri_san_local_certificate": []byte(ratingsSAN),
	}, 100, 40, 2)
	p.host.CompleteConnection(id)

	want := maps.Clone(wantServerLabels)
	for k := range want {
		if strings.HasPrefix(k, "source_") && k != "source_principal" {
			want[k] = "unknown" // no metadata exchange over TCP
		}
	}
	want["destination_service"], want["destination_service_name"] = "unknown", "unknown"
	want["request_protocol"], want["response_code"] = "tcp", "0"
	assert.Equal(t, map[string]uint64{
		"istio_tcp_received_bytes_total":     100,
		"istio_tcp_sent_bytes_total":         42,
		"istio_tcp_connections_opened_total": 1,
		"istio_tcp_connections_closed_total": 1,
	}, p.tcpValues(want))
}

// An open connection reports on the plugin's tick; its report at close adds only what
// came after, and the connection is opened once.
func TestTCPConnectionReportsWhileOpen(t *testing.T) {
	p := mustStart(t, `{"network": true, "tcp_reporting_duration": "2s"}`, productpage, productpageNodeID, outbound)
	assert.Equal(t, uint32(2000), p.host.GetTickPeriod())
	id := p.connection(map[string][]byte{
		"cluster_name":                       []byte("outbound|27017||mongodb.prod.svc.cluster.local"),
		"upstream.uri_san_peer_certificate":  []byte(ratingsSAN),
		"upstream.uri_san_local_certificate": []byte(productpageSAN),
	}, 10, 20)

	want := maps.Clone(wantClientLabels)
	for k := range want {
		if strings.HasPrefix(k, "destination_") && k != "destination_principal" && k != "destination_service_namespace" {
			want[k] = "unknown"
		}
	}
	want["destination_service"], want["destination_service_name"] = "mongodb.prod.svc.cluster.local", "mongodb"
	want["request_protocol"], want["response_code"], want["response_flags"] = "tcp", "0", "-"

	p.host.Tick()
	assert.Equal(t, map[string]uint64{
		"istio_tcp_received_bytes_total":     10,
		"istio_tcp_sent_bytes_total":         20,
		"istio_tcp_connections_opened_total": 1,
		"istio_tcp_connections_closed_total": 0,
	}, p.tcpValues(want))

	require.Equal(t, types.ActionContinue, p.host.CallOnDownstreamData(id, make([]byte, 5)))
	p.host.CompleteConnection(id)
	p.host.Tick() // the closed connection is gone: nothing more
	assert.Equal(t, map[string]uint64{
		"istio_tcp_received_bytes_total":     15,
		"istio_tcp_sent_bytes_total":         20,
		"istio_tcp_connections_opened_total": 1,
		"istio_tcp_connections_closed_total": 1,
	}, p.tcpValues(want))
	assert.Empty(t, p.vm.plugin.conns)
}

// An HTTP plugin neither ticks nor reports TCP metrics, and a network plugin takes no
// HTTP streams.
func TestHTTPAndNetworkPluginsApart(t *testing.T) {
	p := mustStart(t, "", ratings, ratingsNodeID, inbound)
	assert.Zero(t, p.host.GetTickPeriod())
	p.do(serverRequest())
	for _, s := range p.samples() {
		assert.Equal(t, "http", s.labels["request_protocol"], s.name)
	}
	assert.Nil(t, p.vm.plugin.NewTcpContext(7))

	n := mustStart(t, `{"network": true}`, ratings, ratingsNodeID, inbound)
	assert.Nil(t, n.vm.plugin.NewHttpContext(7))
}
