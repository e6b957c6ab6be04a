package envoytypes

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
)

// NewFor returns an empty message of the Envoy type an EnvoyFilter patch with applyTo holds
// (Istio's mapping: LISTENER is a Listener, HTTP_FILTER an HttpFilter, ...), or an error for
// the applyTo values wasmesh does not patch.
func NewFor(applyTo networking.EnvoyFilter_ApplyTo) (proto.Message, error) {
	switch applyTo {
	case networking.EnvoyFilter_LISTENER:
		return &listener.Listener{}, nil
	case networking.EnvoyFilter_FILTER_CHAIN:
		return &listener.FilterChain{}, nil
	case networking.EnvoyFilter_NETWORK_FILTER:
		return &listener.Filter{}, nil
	case networking.EnvoyFilter_LISTENER_FILTER:
		return &listener.ListenerFilter{}, nil
	case networking.EnvoyFilter_HTTP_FILTER:
		return &hcm.HttpFilter{}, nil
	case networking.EnvoyFilter_ROUTE_CONFIGURATION:
		return &route.RouteConfiguration{}, nil
	case networking.EnvoyFilter_VIRTUAL_HOST:
		return &route.VirtualHost{}, nil
	case networking.EnvoyFilter_HTTP_ROUTE:
		return &route.Route{}, nil
	case networking.EnvoyFilter_CLUSTER:
		return &cluster.Cluster{}, nil
	case networking.EnvoyFilter_EXTENSION_CONFIG:
		return &core.TypedExtensionConfig{}, nil
	case networking.EnvoyFilter_BOOTSTRAP:
		return nil, errors.New("BOOTSTRAP is not supported: the bootstrap is written by the agent, not served by discovery")
	}
	return nil, fmt.Errorf("unknown applyTo %v", applyTo)
}

// Decode turns a patch value (the YAML a user wrote, as a Struct) into the Envoy message for
// applyTo. Unknown fields and unknown "@type"s are errors, so a misspelt field is reported
// rather than dropped. Field names may be snake_case or lowerCamelCase, as in Envoy's JSON.
func Decode(applyTo networking.EnvoyFilter_ApplyTo, value *structpb.Struct) (proto.Message, error) {
	m, err := NewFor(applyTo)
	if err != nil {
		return nil, err
	}
	if value == nil {
		return m, nil
	}
	js, err := protojson.Marshal(value)
	if err != nil {
		return nil, err
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		return nil, errors.New(CleanError(err))
	}
	return m, nil
}

// protojson's errors carry a position in JSON the user never wrote and non-breaking spaces.
var protoPos = regexp.MustCompile(`^proto:\s*(\(line \d+:\d+\):\s*)?`)

// CleanError makes a protobuf library error readable in a config error.
func CleanError(err error) string {
	return protoPos.ReplaceAllString(strings.ReplaceAll(err.Error(), "\u00a0", " "), "")
}
