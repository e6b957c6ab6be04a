package statsplan_test

import (
	"fmt"
	"strings"

	"github.com/wasmesh/wasmesh/filters/telemetry/expr"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

// node is the proxy's node as a filter reads it from the host at configure time; this
// one has no node metadata.
func node([]string) ([]byte, bool) { return nil, false }

// Load Istio's stats configuration and see the metrics, tags and dimensions it yields and
// the attributes a request must provide.
func ExampleLoad() {
	pl, err := statsplan.Load([]byte(`{
		"metrics": [
			{"name": "requests_total", "dimensions": {"request_host": "request.host"},
			 "tags_to_remove": ["response_flags"]},
			{"name": "request_bytes", "drop": true}
		],
		"definitions": [
			{"name": "server_errors_total", "value": "response.code >= 500 ? 1 : 0"}
		]
	}`), node)
	if err != nil {
		panic(err)
	}
	for _, m := range pl.Metrics {
		var custom []string
		for _, t := range m.Tags {
			if t.Index >= statsplan.NumStandardLabels {
				custom = append(custom, t.Name+"="+pl.Dimensions[t.Index-statsplan.NumStandardLabels].String())
			}
		}
		fmt.Printf("%s %s: %d tags, group %d %v\n", m.FullName, m.Kind, len(m.Tags), m.Group, custom)
	}
	for slot, a := range pl.Attributes {
		fmt.Printf("slot %d: %s, a %s\n", slot, a.Name, a.Type)
	}
	// Output:
	// istio_requests_total COUNTER: 25 tags, group 0 [request_host=request.host]
	// istio_request_duration_milliseconds HISTOGRAM: 25 tags, group 1 []
	// istio_response_bytes HISTOGRAM: 25 tags, group 1 []
	// istio_tcp_sent_bytes_total COUNTER: 25 tags, group 2 []
	// istio_tcp_received_bytes_total COUNTER: 25 tags, group 2 []
	// istio_tcp_connections_opened_total COUNTER: 25 tags, group 2 []
	// istio_tcp_connections_closed_total COUNTER: 25 tags, group 2 []
	// istio_server_errors_total COUNTER: 25 tags, group 1 []
	// slot 0: response.code, a int
	// slot 1: request.host, a string
}

// A configuration is honoured or refused: an error names what is wrong and where.
func ExampleLoad_error() {
	for _, cfg := range []string{
		`{"metrics": [{"dimensions": {"user": "request.header['x-user']"}}]}`,
		`{"metrics": [{"name": "requests_total", "tags_to_remove": ["respones_code"]}]}`,
		`{"definitions": [{"name": "ok", "value": "response.code < 400"}]}`,
		`{"tcp_reporting_duration": "15 seconds"}`,
	} {
		_, err := statsplan.Load([]byte(cfg), node)
		fmt.Println(err)
	}
	// Output:
	// plugin configuration: metrics[0]: dimension "user": expression "request.header['x-user']": column 1: unknown attribute request.header['x-user']
	// plugin configuration: metrics[0] (requests_total): tags_to_remove: unknown tag "respones_code"
	// plugin configuration: definitions[0] (ok): value expression "response.code < 400" is a bool, a metric value must be an int
	// plugin configuration: tcp_reporting_duration "15 seconds" must be a duration in seconds ("15s", "0.5s") of at least 100ms
}

// Describe prints a plan: here one metric (the others dropped) that keeps three of the standard labels and
// adds a dimension.
func ExamplePlan_Describe() {
	var remove []string
	for _, n := range statsplan.StandardLabelNames {
		if n != "reporter" && n != "response_code" && n != "destination_service_name" {
			remove = append(remove, `"`+n+`"`)
		}
	}
	pl, err := statsplan.Load([]byte(`{
		"stat_prefix": "mesh",
		"metrics": [
			{"tags_to_remove": [`+strings.Join(remove, ", ")+`]},
			{"dimensions": {"method": "request.method"}},
			{"name": "request_duration_milliseconds", "drop": true},
			{"name": "request_bytes", "drop": true},
			{"name": "response_bytes", "drop": true},
			{"name": "tcp_sent_bytes_total", "drop": true},
			{"name": "tcp_received_bytes_total", "drop": true},
			{"name": "tcp_connections_opened_total", "drop": true},
			{"name": "tcp_connections_closed_total", "drop": true}
		]
	}`), node)
	if err != nil {
		panic(err)
	}
	fmt.Print(pl.Describe())
	// Output:
	// reporter: from listener_direction
	// host header fallback: true
	// max label sets per metric: 1000
	// max peer cache size: 500
	//
	// metrics:
	//   mesh_requests_total COUNTER = 1 (group 0)
	//
	// group 0 tags:
	//   reporter
	//   destination_service_name
	//   response_code
	//   method = request.method
	// group 0 name: reporter=.={reporter};.;destination_service_name=.={destination_service_name};.;response_code=.={response_code};.;method=.={method};.;{metric}
}

// A filter that is not a stats filter can still compile expressions over Envoy's and
// Istio's attributes: the Resolver gives each attribute a slot and says where its value
// comes from.
func ExampleResolver() {
	r := statsplan.NewResolver(node)
	e, err := expr.Compile(`request.headers['X-Tenant'] + "/" + upstream_peer.labels['app'] + "/" + string(response.code)`, r.Resolve)
	if err != nil {
		panic(err)
	}
	fmt.Println("type:", e.Type())
	for slot, a := range r.Attributes() {
		switch a.Source {
		case statsplan.SourceRequestHeader:
			fmt.Printf("slot %d: %s from request header %s\n", slot, a.Name, a.Header)
		case statsplan.SourcePeer:
			fmt.Printf("slot %d: %s from the upstream peer's label %s\n", slot, a.Name, a.PeerLabel)
		case statsplan.SourceProperty:
			fmt.Printf("slot %d: %s from property %v, a %s\n", slot, a.Name, a.Path, a.Type)
		}
	}
	// Output:
	// type: string
	// slot 0: request.headers['X-Tenant'] from request header x-tenant
	// slot 1: upstream_peer.labels['app'] from the upstream peer's label app
	// slot 2: response.code from property [response code], a int
}
