package xdsproxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are Istio agent's XDS proxy metrics (pkg/istio-agent/metrics), under the same
// names, and the number of streams to discovery open now.
type metrics struct {
	connectFailures    prometheus.Counter
	istiodTerminations prometheus.Counter
	envoyTerminations  prometheus.Counter
	requests           prometheus.Counter
	responses          prometheus.Counter
	upstreams          prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connectFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "istiod_connection_failures",
			Help: "Streams to discovery that could not be opened."}),
		istiodTerminations: prometheus.NewCounter(prometheus.CounterOpts{Name: "istiod_connection_terminations",
			Help: "Streams to discovery ended by discovery or the connection."}),
		envoyTerminations: prometheus.NewCounter(prometheus.CounterOpts{Name: "envoy_connection_terminations",
			Help: "Streams ended by the proxy."}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: "xds_proxy_requests",
			Help: "Requests forwarded from the proxy to discovery."}),
		responses: prometheus.NewCounter(prometheus.CounterOpts{Name: "xds_proxy_responses",
			Help: "Responses forwarded from discovery to the proxy."}),
		upstreams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "wasmesh_xds_proxy_upstream_streams",
			Help: "Streams to discovery open now (0: the proxy gets no configuration)."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.connectFailures, m.istiodTerminations, m.envoyTerminations,
		m.requests, m.responses, m.upstreams} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("XDS proxy metrics: %w", err)
		}
	}
	return m, nil
}
