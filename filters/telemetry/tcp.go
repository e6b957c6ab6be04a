package main

import (
	"slices"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/internal/guestgc"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// TCP metrics. Loaded as a network filter (envoy.filters.network.wasm, before tcp_proxy)
// with "network": true in its configuration, the filter reports Istio's four TCP metrics per connection, as Istio's stats plugin does:
//
//	istio_tcp_connections_opened_total   1 in the connection's first report
//	istio_tcp_received_bytes_total       bytes from the downstream (the request side)
//	istio_tcp_sent_bytes_total           bytes to the downstream (the response side)
//	istio_tcp_connections_closed_total   1 in its report at close
//
// An open connection reports what it moved every tcp_reporting_duration (15 s by default)
// from the plugin's tick, and once more when it closes. The labels are the standard ones
// with request_protocol "tcp" and response_code "0", as Istio reports them; they are worked
// out once per connection, in its first data callback (when the upstream is chosen), and
// kept for its later reports. The peer's workload labels are "unknown": Istio learns them
// over TCP through its metadata exchange network filter (ALPN istio-peer-exchange), which
// this filter does not implement; the peer's principal comes from its certificate.

const (
	protocolTCP     = "tcp"
	tcpResponseCode = "0"
)

func (p *pluginContext) NewTcpContext(uint32) types.TcpContext {
	if !p.plan.Network {
		return nil
	}
	return &tcpContext{p: p}
}

type tcpContext struct {
	types.DefaultTcpContext
	p *pluginContext

	outbound bool
	// vals are the connection's label values, nil until worked out.
	vals []string
	// received and sent are the bytes not reported yet; opened is set once a report
	// has counted the connection as opened.
	received, sent int64
	opened, closed bool
}

func (c *tcpContext) OnNewConnection() types.Action {
	c.outbound = c.p.outbound()
	c.p.conns[c] = struct{}{}
	return types.ActionContinue
}

func (c *tcpContext) OnDownstreamData(size int, _ bool) types.Action {
	c.received += int64(size)
	c.labels()
	return types.ActionContinue
}

func (c *tcpContext) OnUpstreamData(size int, _ bool) types.Action {
	c.sent += int64(size)
	c.labels()
	return types.ActionContinue
}

func (c *tcpContext) OnStreamDone() {
	c.labels()
	c.closed = true
	c.p.reportTCP(c)
	delete(c.p.conns, c)
	guestgc.StreamDone()
}

// labels works out the connection's label values, the first time; it reads the
// connection's properties, so it runs in one of the connection's own callbacks.
func (c *tcpContext) labels() {
	if c.vals != nil {
		return
	}
	p := c.p
	vals := p.values
	p.setSideLabels(vals, c.outbound, nil, nil)
	vals[statsplan.LabelRequestProtocol] = protocolTCP
	vals[statsplan.LabelResponseCode] = tcpResponseCode
	vals[statsplan.LabelGrpcResponseStatus] = ""
	// The dimensions read properties (a connection has no headers) through the same
	// reader as a request's.
	p.setDimensions(vals, &httpContext{p: p, outbound: c.outbound, statusRead: true, slots: make([]slotState, len(p.plan.Attributes))})
	c.vals = slices.Clone(vals)
}

// reportTCP records what connection c moved since its last report.
func (p *pluginContext) reportTCP(c *tcpContext) {
	for i := range p.plan.Metrics {
		m := &p.plan.Metrics[i]
		var v int64
		ok := m.TCP
		switch m.Value {
		case statsplan.ValueConnectionOpened:
			v, ok = 1, ok && !c.opened
		case statsplan.ValueConnectionClosed:
			v, ok = 1, ok && c.closed
		case statsplan.ValueReceivedBytes:
			v = c.received
		case statsplan.ValueSentBytes:
			v = c.sent
		default:
			ok = false
		}
		p.mvals[i], p.mok[i] = v, ok
	}
	p.reg.report(c.vals, p.mvals, p.mok, true)
	c.opened, c.received, c.sent = true, 0, 0
}

// OnTick reports the open connections whose labels are known: a long connection shows
// in the metrics while it lasts, not only when it ends.
func (p *pluginContext) OnTick() {
	for c := range p.conns {
		if c.vals != nil {
			p.reportTCP(c)
		}
	}
}

// startTCPReporting asks for the tick that reports open connections.
func (p *pluginContext) startTCPReporting() {
	ms := p.plan.TCPReportingDuration.Milliseconds()
	if err := proxywasm.SetTickPeriodMilliSeconds(uint32(ms)); err != nil {
		proxywasm.LogWarnf("telemetry: tcp_reporting_duration: setting the tick: %v", err)
	}
}
