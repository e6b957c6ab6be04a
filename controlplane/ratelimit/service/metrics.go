package service

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are named after Envoy's reference service's stats
// (ratelimit.service.rate_limit.<key>.total_hits and so on), with the descriptor's key as a
// label: "domain.key_value.key" as configured, or the request's values with detailed_metric.
type Metrics struct {
	TotalHits               *prometheus.CounterVec
	OverLimit               *prometheus.CounterVec
	NearLimit               *prometheus.CounterVec
	WithinLimit             *prometheus.CounterVec
	ShadowMode              *prometheus.CounterVec
	OverLimitWithLocalCache *prometheus.CounterVec
	FailurePolicy           *prometheus.CounterVec
	RedisErrors             prometheus.Counter
	RedisLatency            prometheus.Histogram
	ConfigLoad              *prometheus.CounterVec
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	perKey := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_rate_limit_" + name, Help: help,
		}, []string{"key"})
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		TotalHits:               perKey("total_hits", "Hits counted against a limit (hits_addend summed)."),
		OverLimit:               perKey("over_limit", "Hits over the limit."),
		NearLimit:               perKey("near_limit", "Hits within the limit but past the near-limit ratio of it."),
		WithinLimit:             perKey("within_limit", "Hits within the limit."),
		ShadowMode:              perKey("shadow_mode", "Hits over a shadow_mode limit, answered OK."),
		OverLimitWithLocalCache: perKey("over_limit_with_local_cache", "Hits over the limit answered from the local over-limit cache, without Redis."),
		RedisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_redis_errors_total", Help: "Redis pipelines that failed or passed the timeout.",
		}),
		RedisLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_redis_latency_seconds",
			Help:    "Time of one Redis pipeline (a request's INCRBY and EXPIRE).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		FailurePolicy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_failure_policy_total",
			Help: "Requests answered by a domain's failure policy because Redis failed (policy: open or closed).",
		}, []string{"domain", "policy"}),
		ConfigLoad: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_total", Help: "Config loads by result (success or error).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.RedisErrors, m.RedisLatency, m.FailurePolicy, m.ConfigLoad)
	return m
}
