package statsplan

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/jsonconf"
	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
)

// Config is the plugin configuration: Istio's stats plugin configuration (JSON, the
// field names of istio/proxy extensions/stats/config.proto) plus three wasmesh fields.
//
//	{
//	  "metrics": [                         // overrides, applied in order
//	    {"name": "requests_total",         // empty: every metric
//	     "dimensions": {"request_host": "request.host"},  // add or override tags
//	     "tags_to_remove": ["grpc_response_status"],
//	     "drop": false}                    // true: do not report the metric(s)
//	  ],
//	  "definitions": [                     // new metrics (or new values for standard ones)
//	    {"name": "custom_bytes", "type": "HISTOGRAM", "value": "response.total_size"}
//	  ],
//	  "stat_prefix": "istio",              // metric names are <stat_prefix>_<name>
//	  "disable_host_header_fallback": false,
//	  "max_peer_cache_size": 500,          // decoded peers kept; negative: no cache
//	  "max_label_sets_per_metric": 1000,   // wasmesh: cardinality cap per metric
//	  "reporter": "",                      // wasmesh: "source" or "destination"; empty: from listener_direction
//	  "tcp_reporting_duration": "15s",     // how often open TCP connections report
//	  "network": false                     // wasmesh: true when loaded as a network (TCP) filter
//	}
//
// Every field is optional; an empty configuration reports Istio's four HTTP metrics
// with the standard labels. A filter loaded as envoy.filters.network.wasm needs "network":
// true and reports Istio's four TCP metrics instead (the Go SDK gives a plugin either HTTP
// streams or TCP connections, and nothing in Envoy's attributes says which filter type
// loaded it). Unknown fields, Istio fields this filter does not implement
// (with a value other than their default) and expressions it cannot evaluate are errors,
// so a configuration is either honoured or refused. The JSON is read as protobuf reads it
// into Istio's message: a field may be spelt in lowerCamelCase ("statPrefix"), and an
// integer or a boolean may be a string ("max_peer_cache_size": "100", and Istio's own
// charts' "debug": "false").
type Config struct {
	Metrics     []MetricConfig
	Definitions []MetricDefinition

	StatPrefix                string
	DisableHostHeaderFallback bool
	MaxPeerCacheSize          int
	MaxLabelSetsPerMetric     int
	Reporter                  string
	// TCPReportingDuration is how often open TCP connections report what they moved so
	// far (Istio's tcp_reporting_duration, default 15 s); closed ones report at close.
	TCPReportingDuration time.Duration
	// Network says the plugin runs as a network filter: it gets TCP connections, not
	// HTTP streams.
	Network bool
}

// MetricConfig is one entry of metrics: an override of one metric (Name) or of all.
type MetricConfig struct {
	Name         string            `json:"name"`
	Dimensions   map[string]string `json:"dimensions"`
	TagsToRemove []string          `json:"tags_to_remove"`
	Match        string            `json:"match"`
	Drop         bool              `json:"drop"`
}

// MetricDefinition is one entry of definitions: a metric, its type (COUNTER, GAUGE or
// HISTOGRAM) and its value expression, which must be an int.
type MetricDefinition struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Type  string `json:"type"`
}

const (
	defaultStatPrefix       = "istio"
	defaultMaxPeerCacheSize = 500 // Istio's default
	// defaultMaxLabelSets caps distinct label sets per metric (the filter's registry). A sidecar talks to a
	// bounded set of peers, codes and flags, so real traffic stays far below it; a
	// custom dimension fed from request data (a header, a path) is what reaches it.
	defaultMaxLabelSets = 1000

	defaultTCPReportingDuration = 15 * time.Second // Istio's default
	minTCPReportingDuration     = 100 * time.Millisecond
)

// rawConfig mirrors the JSON.
type rawConfig struct {
	Metrics                   []MetricConfig     `json:"metrics"`
	Definitions               []MetricDefinition `json:"definitions"`
	StatPrefix                *string            `json:"stat_prefix"`
	FieldSeparator            *string            `json:"field_separator"`
	ValueSeparator            *string            `json:"value_separator"`
	DisableHostHeaderFallback bool               `json:"disable_host_header_fallback"`
	MaxPeerCacheSize          int                `json:"max_peer_cache_size"`
	MaxLabelSetsPerMetric     *int               `json:"max_label_sets_per_metric"`
	Reporter                  string             `json:"reporter"`
	Debug                     bool               `json:"debug"` // deprecated in Istio; accepted, no effect
	TCPReportingDuration      *string            `json:"tcp_reporting_duration"`
	MetadataMode              jsonconf.Raw       `json:"metadata_mode"`
	Network                   bool               `json:"network"`
}

// ParseConfig decodes the plugin configuration (JSON, read as protobuf reads it; empty
// means the defaults), refusing what it does not know; expressions are compiled later, by
// [Build].
func ParseConfig(data []byte) (Config, error) {
	cfg := Config{
		StatPrefix:            defaultStatPrefix,
		MaxPeerCacheSize:      defaultMaxPeerCacheSize,
		MaxLabelSetsPerMetric: defaultMaxLabelSets,
		TCPReportingDuration:  defaultTCPReportingDuration,
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	var raw rawConfig
	if err := (jsonconf.Options{Proto: true}).Unmarshal(data, &raw); err != nil {
		return Config{}, err
	}
	if raw.FieldSeparator != nil && *raw.FieldSeparator != FieldSeparator {
		return Config{}, fmt.Errorf("field_separator %q is not supported: tags are always encoded with %q", *raw.FieldSeparator, FieldSeparator)
	}
	if raw.ValueSeparator != nil && *raw.ValueSeparator != ValueSeparator {
		return Config{}, fmt.Errorf("value_separator %q is not supported: tags are always encoded with %q", *raw.ValueSeparator, ValueSeparator)
	}
	if raw.TCPReportingDuration != nil {
		// Protobuf's JSON form of a Duration: decimal seconds with an "s" suffix.
		d, err := time.ParseDuration(*raw.TCPReportingDuration)
		if err != nil || !strings.HasSuffix(*raw.TCPReportingDuration, "s") || d < minTCPReportingDuration {
			return Config{}, fmt.Errorf("tcp_reporting_duration %q must be a duration in seconds (\"15s\", \"0.5s\") of at least %v", *raw.TCPReportingDuration, minTCPReportingDuration)
		}
		cfg.TCPReportingDuration = d
	}
	if raw.MetadataMode != nil {
		return Config{}, errors.New("metadata_mode is not supported: peers are identified by metadata exchange only")
	}
	if raw.StatPrefix != nil {
		if *raw.StatPrefix != "" && !expr.IsIdentifier(*raw.StatPrefix) {
			return Config{}, fmt.Errorf("stat_prefix %q must be letters, digits and underscores", *raw.StatPrefix)
		}
		cfg.StatPrefix = *raw.StatPrefix
	}
	cfg.DisableHostHeaderFallback = raw.DisableHostHeaderFallback
	cfg.Network = raw.Network
	switch {
	case raw.MaxPeerCacheSize < 0:
		cfg.MaxPeerCacheSize = -1
	case raw.MaxPeerCacheSize > 0:
		cfg.MaxPeerCacheSize = raw.MaxPeerCacheSize
	}
	if n := raw.MaxLabelSetsPerMetric; n != nil {
		if *n < 1 {
			return Config{}, fmt.Errorf("max_label_sets_per_metric must be at least 1, not %d", *n)
		}
		cfg.MaxLabelSetsPerMetric = *n
	}
	switch raw.Reporter {
	case "", "UNSPECIFIED":
	case ReporterSource, ReporterDestination:
		cfg.Reporter = raw.Reporter
	default:
		return Config{}, fmt.Errorf("reporter %q must be %q, %q or empty (decided by listener_direction)", raw.Reporter, ReporterSource, ReporterDestination)
	}
	for i, mc := range raw.Metrics {
		if mc.Match != "" {
			return Config{}, fmt.Errorf("metrics[%d]: match is not supported (Istio does not implement it either)", i)
		}
	}
	cfg.Metrics, cfg.Definitions = raw.Metrics, raw.Definitions
	return cfg, nil
}
