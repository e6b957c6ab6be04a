package main

import (
	"strconv"
	"strings"

	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

const (
	unknown          = "unknown"
	policyMutualTLS  = "mutual_tls"
	policyNone       = "none"
	protocolHTTP     = "http"
	protocolGRPC     = "grpc"
	noResponseFlags  = "-"
	grpcContentType  = "application/grpc"
	grpcStatusNoInfo = "2" // Istio reports UNKNOWN for a gRPC response without a status
)

// setWorkloadLabels fills the six workload labels of one side (source or destination)
// from w, or "unknown" for a side that did not identify itself. Istio reports
// "unknown" for every empty label; canonical revision falls back to "latest" only for
// a workload that is known.
func setWorkloadLabels(vals []string, source bool, w *workload) {
	var workload, namespace, app, version, canonicalService, canonicalRevision, cluster = unknown, unknown, unknown, unknown, unknown, unknown, unknown
	if w != nil {
		workload = orUnknown(w.id.WorkloadName)
		namespace = orUnknown(w.id.Namespace)
		app = orUnknown(w.app)
		version = orUnknown(w.version)
		canonicalService = orUnknown(w.canonicalService)
		canonicalRevision = w.canonicalRevision
		cluster = orUnknown(w.id.ClusterID)
	}
	if source {
		vals[statsplan.LabelSourceWorkload] = workload
		vals[statsplan.LabelSourceWorkloadNamespace] = namespace
		vals[statsplan.LabelSourceApp] = app
		vals[statsplan.LabelSourceVersion] = version
		vals[statsplan.LabelSourceCanonicalService] = canonicalService
		vals[statsplan.LabelSourceCanonicalRevision] = canonicalRevision
		vals[statsplan.LabelSourceCluster] = cluster
		return
	}
	vals[statsplan.LabelDestinationWorkload] = workload
	vals[statsplan.LabelDestinationWorkloadNamespace] = namespace
	vals[statsplan.LabelDestinationApp] = app
	vals[statsplan.LabelDestinationVersion] = version
	vals[statsplan.LabelDestinationCanonicalService] = canonicalService
	vals[statsplan.LabelDestinationCanonicalRevision] = canonicalRevision
	vals[statsplan.LabelDestinationCluster] = cluster
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

// destinationService returns destination_service, destination_service_name and, when
// the host says it, destination_service_namespace. The host comes from Istio's cluster
// name outbound|PORT|SUBSET|HOST (or inbound|PORT|SUBSET|HOST), else from the
// :authority when useHost is set, as Istio's host-header fallback does (authority is
// called only then; nil means there is none, as for a TCP connection). A Kubernetes
// service host NAME.NAMESPACE.svc[.DOMAIN] gives the short name and namespace (what
// Istio takes from the cluster's service metadata); any other host is its own name,
// and the namespace is left to the caller (Istio uses the destination workload's).
// Istio's passthrough and blackhole clusters name the service themselves.
func destinationService(cluster string, authority func() string, useHost bool) (service, name, namespace string) {
	if !useHost || authority == nil {
		authority = func() string { return "" }
	}
	switch cluster {
	case "BlackHoleCluster", "PassthroughCluster", "InboundPassthroughClusterIpv4", "InboundPassthroughClusterIpv6":
		service = unknown
		if a := authority(); a != "" {
			service = stripPort(a)
		}
		return service, cluster, ""
	}
	host := clusterHost(cluster)
	if host == "" {
		host = stripPort(authority())
	}
	if host == "" {
		return unknown, unknown, ""
	}
	if n, ns, ok := kubernetesService(host); ok {
		return host, n, ns
	}
	return host, host, ""
}

// clusterHost returns HOST from an Istio cluster name DIRECTION|PORT|SUBSET|HOST.
func clusterHost(cluster string) string {
	dir, rest, ok := strings.Cut(cluster, "|")
	if !ok || (dir != "outbound" && dir != "inbound") {
		return ""
	}
	_, rest, ok1 := strings.Cut(rest, "|") // port
	_, host, ok2 := strings.Cut(rest, "|") // subset
	if !ok1 || !ok2 {
		return ""
	}
	return host
}

// kubernetesService splits NAME.NAMESPACE.svc[.DOMAIN].
func kubernetesService(host string) (name, namespace string, ok bool) {
	name, rest, ok1 := strings.Cut(host, ".")
	namespace, rest, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || name == "" || namespace == "" || (rest != "svc" && !strings.HasPrefix(rest, "svc.")) {
		return "", "", false
	}
	return name, namespace, true
}

// stripPort removes a :PORT suffix from an authority, keeping IPv6 brackets intact.
func stripPort(authority string) string {
	i := strings.LastIndexByte(authority, ':')
	if i < 0 || strings.IndexByte(authority[i:], ']') >= 0 {
		return authority
	}
	if _, err := strconv.Atoi(authority[i+1:]); err != nil {
		return authority
	}
	return authority[:i]
}

// isGRPC says whether a request's content-type makes its request_protocol "grpc" rather
// than "http", as in Istio.
func isGRPC(contentType string) bool {
	return strings.HasPrefix(contentType, grpcContentType)
}

// responseFlagCodes are Envoy's response flag bits (StreamInfo::ResponseFlag) and their
// short codes, in bit order, which is the order Envoy and Istio print them in.
var responseFlagCodes = [...]string{
	"LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE",
	"DC", "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF",
	"DO", "DR",
}

// responseFlags renders Envoy's response.flags bitmask as Istio does: the short codes
// joined by ",", or "-" for none. Bits newer than this table are ignored, as Istio does.
func responseFlags(bits uint64) string {
	if bits == 0 {
		return noResponseFlags
	}
	var b strings.Builder
	for i, code := range responseFlagCodes {
		if bits&(1<<i) == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(code)
	}
	if b.Len() == 0 {
		return noResponseFlags
	}
	return b.String()
}

// statusText returns the decimal form of an HTTP status without allocating for the
// codes proxies actually send.
func statusText(code int64, table *[600]string) string {
	if code >= 0 && code < int64(len(table)) {
		return table[code]
	}
	return strconv.FormatInt(code, 10)
}

func newStatusTable() *[600]string {
	var t [600]string
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return &t
}
