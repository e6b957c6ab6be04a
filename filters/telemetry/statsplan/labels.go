package statsplan

// The standard labels, Istio's, in the order Istio's stats plugin writes them into a metric
// name: the indices of a request's label values, before the configured dimensions.
const (
	LabelReporter = iota
	LabelSourceWorkload
	LabelSourceWorkloadNamespace
	LabelSourcePrincipal
	LabelSourceApp
	LabelSourceVersion
	LabelSourceCanonicalService
	LabelSourceCanonicalRevision
	LabelSourceCluster
	LabelDestinationWorkload
	LabelDestinationWorkloadNamespace
	LabelDestinationPrincipal
	LabelDestinationApp
	LabelDestinationVersion
	LabelDestinationService
	LabelDestinationServiceName
	LabelDestinationServiceNamespace
	LabelDestinationCanonicalService
	LabelDestinationCanonicalRevision
	LabelDestinationCluster
	LabelRequestProtocol
	LabelResponseCode
	LabelGrpcResponseStatus
	LabelResponseFlags
	LabelConnectionSecurityPolicy
	NumStandardLabels
)

// StandardLabelNames are the tag names of the standard labels, indexed by the Label*
// constants.
var StandardLabelNames = [NumStandardLabels]string{
	"reporter",
	"source_workload",
	"source_workload_namespace",
	"source_principal",
	"source_app",
	"source_version",
	"source_canonical_service",
	"source_canonical_revision",
	"source_cluster",
	"destination_workload",
	"destination_workload_namespace",
	"destination_principal",
	"destination_app",
	"destination_version",
	"destination_service",
	"destination_service_name",
	"destination_service_namespace",
	"destination_canonical_service",
	"destination_canonical_revision",
	"destination_cluster",
	"request_protocol",
	"response_code",
	"grpc_response_status",
	"response_flags",
	"connection_security_policy",
}

// The values of the reporter label, and of a configuration's "reporter".
const (
	ReporterSource      = "source"      // the client side: an outbound listener
	ReporterDestination = "destination" // the server side: an inbound listener
)

// The proxy-wasm ABI defines a metric by name only, so tags travel inside the name the way
// Istio's stats plugin puts them there: every tag as NAME=.=VALUE;.; in the metric's tag
// order, then the metric's own name:
//
//	reporter=.=destination;.;source_workload=.=productpage-v1;.;...;.;istio_requests_total
//
// The proxy's stats_tags rules, one per tag name, (NAME=\.=(.*?);\.;), cut each tag out of
// the name (the first capture group is removed, the second is the value), which leaves
// istio_requests_total.
const (
	ValueSeparator = "=.="
	FieldSeparator = ";.;"
)
