// Package metrics holds the control plane's Prometheus metrics under Istio's pilot_* names,
// so dashboards and alerts written for istiod read wasmesh's discovery unchanged.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is one set of collectors, registered on the registry given to New. Components
// receive it explicitly; there is no global registry.
type Metrics struct {
	XDSClients           *prometheus.GaugeVec     // pilot_xds{version}
	Pushes               *prometheus.CounterVec   // pilot_xds_pushes{type}
	PushTime             *prometheus.HistogramVec // pilot_xds_push_time{type}
	SendTime             prometheus.Histogram     // pilot_xds_send_time
	ConvergenceTime      prometheus.Histogram     // pilot_proxy_convergence_time
	DebounceTime         prometheus.Histogram     // pilot_debounce_time
	QueueTime            prometheus.Histogram     // pilot_proxy_queue_time
	PushContextInitTime  prometheus.Histogram     // pilot_pushcontext_init_seconds
	Rejects              *prometheus.CounterVec   // pilot_total_xds_rejects{type}
	WriteTimeouts        prometheus.Counter       // pilot_xds_write_timeout
	InternalErrors       *prometheus.CounterVec   // pilot_total_xds_internal_errors{type}
	ExpiredNonce         *prometheus.CounterVec   // pilot_xds_expired_nonce{type}
	ConfigSize           *prometheus.HistogramVec // pilot_xds_config_size_bytes{type}
	Services             prometheus.Gauge         // pilot_services
	PushTriggers         *prometheus.CounterVec   // pilot_push_triggers{type}
	InboundUpdates       *prometheus.CounterVec   // pilot_inbound_updates{type}
	ConfigEvents         *prometheus.CounterVec   // pilot_k8s_cfg_events{type,event}
	ConfigRejects        *prometheus.CounterVec   // pilot_config_rejected{kind}
	EDSNoInstances       prometheus.Gauge         // pilot_eds_no_instances
	ConnectionsRejected  prometheus.Counter       // pilot_xds_connections_rejected (admission control)
	AutoRegistrations    prometheus.Counter       // auto_registration_success_total
	AutoUnregistrations  prometheus.Counter       // auto_registration_deletes_total
	DuplicateServiceHost prometheus.Counter       // pilot_duplicate_envoy_clusters-like: hosts defined twice
}

// Buckets like istiod's: pushes and convergence span milliseconds to tens of seconds.
var durationBuckets = []float64{.01, .1, .5, 1, 3, 5, 10, 20, 30}
var sizeBuckets = []float64{1, 10000, 1000000, 4000000, 10000000, 40000000}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		XDSClients:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pilot_xds", Help: "Number of endpoints connected to this pilot using XDS."}, []string{"version"}),
		Pushes:               prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_xds_pushes", Help: "Pilot build and send errors for lds, rds, cds and eds."}, []string{"type"}),
		PushTime:             prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pilot_xds_push_time", Help: "Total time in seconds Pilot takes to push lds, rds, cds and eds.", Buckets: durationBuckets}, []string{"type"}),
		SendTime:             prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pilot_xds_send_time", Help: "Total time in seconds Pilot takes to send generated configuration.", Buckets: durationBuckets}),
		ConvergenceTime:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pilot_proxy_convergence_time", Help: "Delay in seconds between config change and a proxy receiving all required configuration.", Buckets: durationBuckets}),
		DebounceTime:         prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pilot_debounce_time", Help: "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue.", Buckets: durationBuckets}),
		QueueTime:            prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pilot_proxy_queue_time", Help: "Time in seconds, a proxy is in the push queue before being dequeued.", Buckets: durationBuckets}),
		PushContextInitTime:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pilot_pushcontext_init_seconds", Help: "Total time in seconds Pilot takes to init pushContext.", Buckets: durationBuckets}),
		Rejects:              prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_total_xds_rejects", Help: "Total number of XDS responses from pilot rejected by proxy."}, []string{"type"}),
		WriteTimeouts:        prometheus.NewCounter(prometheus.CounterOpts{Name: "pilot_xds_write_timeout", Help: "Pilot XDS response write timeouts."}),
		InternalErrors:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_total_xds_internal_errors", Help: "Total number of internal XDS errors in pilot."}, []string{"type"}),
		ExpiredNonce:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_xds_expired_nonce", Help: "Total number of XDS requests with an expired nonce."}, []string{"type"}),
		ConfigSize:           prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pilot_xds_config_size_bytes", Help: "Distribution of configuration sizes pushed to clients", Buckets: sizeBuckets}, []string{"type"}),
		Services:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "pilot_services", Help: "Total services known to pilot."}),
		PushTriggers:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_push_triggers", Help: "Total number of times a push was triggered, labeled by reason for the push."}, []string{"type"}),
		InboundUpdates:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_inbound_updates", Help: "Total number of updates received by pilot."}, []string{"type"}),
		ConfigEvents:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_k8s_cfg_events", Help: "Events from the config sources."}, []string{"type", "event"}),
		ConfigRejects:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pilot_config_rejected", Help: "Config documents rejected by parsing or validation (the last good version stays in force)."}, []string{"kind"}),
		EDSNoInstances:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "pilot_eds_no_instances", Help: "Number of clusters without instances."}),
		ConnectionsRejected:  prometheus.NewCounter(prometheus.CounterOpts{Name: "pilot_xds_connections_rejected", Help: "XDS connections turned away by admission control."}),
		AutoRegistrations:    prometheus.NewCounter(prometheus.CounterOpts{Name: "auto_registration_success_total", Help: "Total number of successful auto registrations."}),
		AutoUnregistrations:  prometheus.NewCounter(prometheus.CounterOpts{Name: "auto_registration_deletes_total", Help: "Total number of auto registrations cleaned up after the grace period."}),
		DuplicateServiceHost: prometheus.NewCounter(prometheus.CounterOpts{Name: "pilot_duplicate_service_hosts", Help: "Service hosts defined by more than one ServiceEntry (the first one wins)."}),
	}
	reg.MustRegister(m.XDSClients, m.Pushes, m.PushTime, m.SendTime, m.ConvergenceTime, m.DebounceTime,
		m.QueueTime, m.PushContextInitTime, m.Rejects, m.WriteTimeouts, m.InternalErrors, m.ExpiredNonce,
		m.ConfigSize, m.Services, m.PushTriggers, m.InboundUpdates, m.ConfigEvents, m.ConfigRejects,
		m.EDSNoInstances, m.ConnectionsRejected, m.AutoRegistrations, m.AutoUnregistrations, m.DuplicateServiceHost)
	return m
}
