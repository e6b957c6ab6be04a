package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// config is the plugin configuration: Istio's stats plugin configuration (JSON, the
// field names of istio/proxy extensions/stats/config.proto) plus two wasmesh fields.
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
//	  "max_label_sets_per_metric": 1000,   // wasmesh: cardinality cap, see registry.go
//	  "reporter": ""                       // wasmesh: "source" or "destination"; empty: from listener_direction
//	}
//
// Every field is optional; an empty configuration reports Istio's four HTTP metrics
// with the standard labels. Unknown fields, Istio fields this filter does not implement
// (with a value other than their default) and expressions it cannot evaluate are errors,
// so a configuration is either honoured or refused.
type config struct {
	Metrics     []metricConfig
	Definitions []metricDefinition

	StatPrefix                string
	DisableHostHeaderFallback bool
	MaxPeerCacheSize          int
	MaxLabelSetsPerMetric     int
	Reporter                  string
}

type metricConfig struct {
	Name         string            `json:"name"`
	Dimensions   map[string]string `json:"dimensions"`
	TagsToRemove []string          `json:"tags_to_remove"`
	Match        string            `json:"match"`
	Drop         bool              `json:"drop"`
}

type metricDefinition struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Type  string `json:"type"`
}

const (
	defaultStatPrefix       = "istio"
	defaultMaxPeerCacheSize = 500 // Istio's default
	// defaultMaxLabelSets caps distinct label sets per metric. A sidecar talks to a
	// bounded set of peers, codes and flags, so real traffic stays far below it; a
	// custom dimension fed from request data (a header, a path) is what reaches it.
	defaultMaxLabelSets = 1000
)

// rawConfig mirrors the JSON; list elements stay raw so each is decoded strictly on its
// own and its errors say which one.
type rawConfig struct {
	Metrics                   []json.RawMessage `json:"metrics"`
	Definitions               []json.RawMessage `json:"definitions"`
	StatPrefix                *string           `json:"stat_prefix"`
	FieldSeparator            *string           `json:"field_separator"`
	ValueSeparator            *string           `json:"value_separator"`
	DisableHostHeaderFallback bool              `json:"disable_host_header_fallback"`
	MaxPeerCacheSize          int               `json:"max_peer_cache_size"`
	MaxLabelSetsPerMetric     *int              `json:"max_label_sets_per_metric"`
	Reporter                  string            `json:"reporter"`
	Debug                     bool              `json:"debug"` // deprecated in Istio; accepted, no effect
	TCPReportingDuration      *string           `json:"tcp_reporting_duration"`
	MetadataMode              *json.RawMessage  `json:"metadata_mode"`
}

// parseConfig decodes the plugin configuration; empty means the defaults.
func parseConfig(data []byte) (config, error) {
	cfg := config{
		StatPrefix:            defaultStatPrefix,
		MaxPeerCacheSize:      defaultMaxPeerCacheSize,
		MaxLabelSetsPerMetric: defaultMaxLabelSets,
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return cfg, nil
	}
	var raw rawConfig
	if err := decodeStrict(data, &raw); err != nil {
		return config{}, err
	}
	if raw.FieldSeparator != nil && *raw.FieldSeparator != fieldSeparator {
		return config{}, fmt.Errorf("field_separator %q is not supported: tags are always encoded with %q", *raw.FieldSeparator, fieldSeparator)
	}
	if raw.ValueSeparator != nil && *raw.ValueSeparator != valueSeparator {
		return config{}, fmt.Errorf("value_separator %q is not supported: tags are always encoded with %q", *raw.ValueSeparator, valueSeparator)
	}
	if raw.TCPReportingDuration != nil {
		return config{}, errors.New("tcp_reporting_duration is not supported: this filter reports HTTP metrics only")
	}
	if raw.MetadataMode != nil {
		return config{}, errors.New("metadata_mode is not supported: peers are identified by metadata exchange only")
	}
	if raw.StatPrefix != nil {
		if *raw.StatPrefix != "" && !isIdentifier(*raw.StatPrefix) {
			return config{}, fmt.Errorf("stat_prefix %q must be letters, digits and underscores", *raw.StatPrefix)
		}
		cfg.StatPrefix = *raw.StatPrefix
	}
	cfg.DisableHostHeaderFallback = raw.DisableHostHeaderFallback
	switch {
	case raw.MaxPeerCacheSize < 0:
		cfg.MaxPeerCacheSize = -1
	case raw.MaxPeerCacheSize > 0:
		cfg.MaxPeerCacheSize = raw.MaxPeerCacheSize
	}
	if n := raw.MaxLabelSetsPerMetric; n != nil {
		if *n < 1 {
			return config{}, fmt.Errorf("max_label_sets_per_metric must be at least 1, not %d", *n)
		}
		cfg.MaxLabelSetsPerMetric = *n
	}
	switch raw.Reporter {
	case "", "UNSPECIFIED":
	case reporterSource, reporterDest:
		cfg.Reporter = raw.Reporter
	default:
		return config{}, fmt.Errorf("reporter %q must be %q, %q or empty (decided by listener_direction)", raw.Reporter, reporterSource, reporterDest)
	}
	for i, m := range raw.Metrics {
		var mc metricConfig
		if err := decodeStrict(m, &mc); err != nil {
			return config{}, fmt.Errorf("metrics[%d]: %w", i, err)
		}
		if mc.Match != "" {
			return config{}, fmt.Errorf("metrics[%d]: match is not supported (Istio does not implement it either)", i)
		}
		cfg.Metrics = append(cfg.Metrics, mc)
	}
	for i, d := range raw.Definitions {
		var md metricDefinition
		if err := decodeStrict(d, &md); err != nil {
			return config{}, fmt.Errorf("definitions[%d]: %w", i, err)
		}
		cfg.Definitions = append(cfg.Definitions, md)
	}
	return cfg, nil
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and trailing data.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}
