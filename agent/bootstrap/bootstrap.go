// Package bootstrap turns what the agent knows about its pod (environment, pod labels and
// annotations, ProxyConfig) into the Envoy v3 bootstrap the proxy starts with: node
// identity and metadata, ADS to discovery, the admin, readiness and Prometheus listeners,
// and the stats tag rules that turn filter-encoded names into Prometheus labels.
package bootstrap

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	meshconfig "istio.io/api/mesh/v1alpha1"
)

// Defaults of the inputs that docs/contracts.md fixes.
const (
	DefaultLocalhost      = "127.0.0.1"
	DefaultWildcard       = "0.0.0.0"
	DefaultReadinessPort  = 15021
	DefaultPrometheusPort = 15090
	DefaultClusterID      = "Kubernetes"
	DefaultMeshID         = "cluster.local"

	// AnnotationInterceptionMode chooses how traffic reaches the proxy.
	AnnotationInterceptionMode = "sidecar.istio.io/interceptionMode"
)

var interceptionModes = map[string]bool{"REDIRECT": true, "TPROXY": true, "NONE": true}

// Input is everything a bootstrap is made from.
type Input struct {
	PodName        string
	PodNamespace   string
	InstanceIP     string
	ServiceAccount string
	// Labels and Annotations come from the downward-API files.
	Labels      map[string]string
	Annotations map[string]string
	// Env is the agent's environment (KEY=value), read for ISTIO_META_*.
	Env         []string
	ProxyConfig *meshconfig.ProxyConfig
	// ServiceCluster is --serviceCluster; empty means Istio's default (<app>.<ns>).
	ServiceCluster string
	// Localhost and Wildcard are WASMESH_LOCALHOST and WASMESH_WILDCARD.
	Localhost string
	Wildcard  string
	// ReadinessPort and PrometheusPort default to 15021 and 15090.
	ReadinessPort  int
	PrometheusPort int
	Version        string
	// SDSSocketPath, when set, is the agent's SDS socket: the bootstrap gets Istio's
	// sds-grpc cluster, a pipe to it.
	SDSSocketPath string
	// XDSSocketPath, when set, is the agent's XDS proxy socket: the xds-grpc cluster is a
	// pipe to it, plaintext (the agent holds the credentials for discovery).
	XDSSocketPath string
}

// Params is the data a bootstrap template is executed with. A custom template may use
// any of these fields; the default template (envoy_bootstrap.json.tmpl) uses them all.
type Params struct {
	NodeID        string
	Cluster       string
	Metadata      map[string]any
	AdminAddress  string
	AdminPort     int
	DiscoveryHost string
	DiscoveryPort int
	DiscoveryIsIP bool
	// XDSAPIType is the ADS api_type: DELTA_GRPC, or GRPC (State of the World) when
	// ISTIO_DELTA_XDS=false, as Istio since 1.22.
	XDSAPIType        string
	Wildcard          string
	Localhost         string
	ReadinessPort     int
	PrometheusPort    int
	StatusAddress     string
	StatusPort        int
	StatsTags         []StatsTag
	StatsInclusion    []map[string]any
	ConnectTimeout    string
	InterceptionMode  string
	InstanceIPs       []string
	ProxyConfigJSON   map[string]any
	ServiceNode       string
	WorkloadName      string
	ConcurrencyOrZero int
	// SDSSocketPath is the agent's SDS socket (empty: no sds-grpc cluster).
	SDSSocketPath string
	// XDSSocketPath is the agent's XDS proxy socket (empty: xds-grpc goes straight to
	// DiscoveryHost:DiscoveryPort).
	XDSSocketPath string
}

// NodeID is Istio's sidecar node id.
func NodeID(ip, pod, ns string) string {
	return fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, ns, ns)
}

// WorkloadName is the pod's workload: ISTIO_META_WORKLOAD_NAME when set, else the pod name
// without the two suffixes a Deployment adds (ReplicaSet hash, pod hash).
func WorkloadName(pod string, env map[string]string) string {
	if w := env["ISTIO_META_WORKLOAD_NAME"]; w != "" {
		return w
	}
	parts := strings.Split(pod, "-")
	if len(parts) > 2 {
		return strings.Join(parts[:len(parts)-2], "-")
	}
	return pod
}

// NewParams computes the template data, or an error naming the bad input.
func NewParams(in Input) (*Params, error) {
	pc := in.ProxyConfig
	env := EnvMap(in.Env)
	if in.Localhost == "" {
		in.Localhost = DefaultLocalhost
	}
	if in.Wildcard == "" {
		in.Wildcard = DefaultWildcard
	}
	if in.ReadinessPort == 0 {
		in.ReadinessPort = DefaultReadinessPort
	}
	if in.PrometheusPort == 0 {
		in.PrometheusPort = DefaultPrometheusPort
	}
	for name, v := range map[string]string{"WASMESH_LOCALHOST": in.Localhost, "WASMESH_WILDCARD": in.Wildcard} {
		if net.ParseIP(v) == nil {
			return nil, fmt.Errorf("%s: %q is not an IP address", name, v)
		}
	}
	if in.InstanceIP != "" && net.ParseIP(in.InstanceIP) == nil {
		return nil, fmt.Errorf("INSTANCE_IP: %q is not an IP address", in.InstanceIP)
	}

	apiType := "DELTA_GRPC"
	if v := env["ISTIO_DELTA_XDS"]; v != "" {
		delta, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("ISTIO_DELTA_XDS: %q is not a boolean", v)
		}
		if !delta {
			apiType = "GRPC"
		}
	}

	mode := "REDIRECT"
	if m := env["ISTIO_META_INTERCEPTION_MODE"]; m != "" {
		mode = m
		if !interceptionModes[m] {
			return nil, fmt.Errorf("ISTIO_META_INTERCEPTION_MODE: unknown value %q (want REDIRECT, TPROXY or NONE)", m)
		}
	}
	if a, ok := in.Annotations[AnnotationInterceptionMode]; ok {
		if !interceptionModes[a] {
			return nil, fmt.Errorf("annotation %s: unknown value %q (want REDIRECT, TPROXY or NONE)", AnnotationInterceptionMode, a)
		}
		mode = a
	}

	instanceIPs := []string{}
	if in.InstanceIP != "" {
		instanceIPs = append(instanceIPs, in.InstanceIP)
	}
	if extra := env["ISTIO_META_INSTANCE_IPS"]; extra != "" {
		for _, ip := range strings.Split(extra, ",") {
			if ip = strings.TrimSpace(ip); ip != "" && ip != in.InstanceIP {
				instanceIPs = append(instanceIPs, ip)
			}
		}
	}

	tags, err := StatsTags(in.Annotations, pc)
	if err != nil {
		return nil, err
	}
	inclusion, err := StatsInclusion(in.Annotations, pc, instanceIPs)
	if err != nil {
		return nil, err
	}

	host, portText, err := net.SplitHostPort(pc.GetDiscoveryAddress())
	if err != nil {
		return nil, fmt.Errorf("discovery address %q: %w", pc.GetDiscoveryAddress(), err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("discovery address %q: bad port", pc.GetDiscoveryAddress())
	}

	workload := WorkloadName(in.PodName, env)
	pcJSON, err := protoToMap(pc)
	if err != nil {
		return nil, err
	}
	meta, err := nodeMetadata(in, env, workload, mode, instanceIPs, pcJSON)
	if err != nil {
		return nil, err
	}

	statusAddr := in.Wildcard
	if statusAddr == DefaultWildcard {
		statusAddr = DefaultLocalhost
	}
	statusPort := int(pc.GetStatusPort())
	if statusPort == 0 {
		statusPort = 15020
	}
	adminPort := int(pc.GetProxyAdminPort())
	if adminPort == 0 {
		adminPort = 15000
	}
	nodeID := NodeID(in.InstanceIP, in.PodName, in.PodNamespace)
	return &Params{
		NodeID:            nodeID,
		ServiceNode:       nodeID,
		Cluster:           serviceCluster(in.ServiceCluster, in.Labels, workload, in.PodNamespace),
		Metadata:          meta,
		AdminAddress:      in.Localhost,
		AdminPort:         adminPort,
		DiscoveryHost:     host,
		DiscoveryPort:     port,
		DiscoveryIsIP:     net.ParseIP(host) != nil,
		XDSAPIType:        apiType,
		Wildcard:          in.Wildcard,
		Localhost:         in.Localhost,
		ReadinessPort:     in.ReadinessPort,
		PrometheusPort:    in.PrometheusPort,
		StatusAddress:     statusAddr,
		StatusPort:        statusPort,
		StatsTags:         tags,
		StatsInclusion:    inclusion.Patterns(),
		ConnectTimeout:    "1s",
		InterceptionMode:  mode,
		InstanceIPs:       instanceIPs,
		ProxyConfigJSON:   pcJSON,
		WorkloadName:      workload,
		ConcurrencyOrZero: int(pc.GetConcurrency().GetValue()),
		SDSSocketPath:     in.SDSSocketPath,
		XDSSocketPath:     in.XDSSocketPath,
	}, nil
}

// serviceCluster is Istio's default node cluster: an explicit name other than
// istio-proxy wins, else <app label>.<ns>, else <workload>.<ns>.
func serviceCluster(flag string, labels map[string]string, workload, ns string) string {
	if flag != "" && flag != "istio-proxy" {
		return flag
	}
	if app := labels["app"]; app != "" {
		return app + "." + ns
	}
	if workload != "" {
		return workload + "." + ns
	}
	return "istio-proxy." + ns
}

// objectKeys are the metadata keys whose values are JSON objects the agent fills; an
// ISTIO_META_ variable of the same name would turn them into strings, which the control
// plane and the telemetry filter could not read.
var objectKeys = map[string]bool{"LABELS": true, "ANNOTATIONS": true, "PROXY_CONFIG": true}

func nodeMetadata(in Input, env map[string]string, workload, mode string, ips []string, pcJSON map[string]any) (map[string]any, error) {
	meta := map[string]any{
		"NAME":              in.PodName,
		"NAMESPACE":         in.PodNamespace,
		"WORKLOAD_NAME":     workload,
		"OWNER":             fmt.Sprintf("kubernetes://apis/apps/v1/namespaces/%s/deployments/%s", in.PodNamespace, workload),
		"SERVICE_ACCOUNT":   in.ServiceAccount,
		"CLUSTER_ID":        DefaultClusterID,
		"MESH_ID":           DefaultMeshID,
		"INSTANCE_IPS":      strings.Join(ips, ","),
		"INTERCEPTION_MODE": mode,
		"ISTIO_VERSION":     in.Version,
		"WASMESH_LOCALHOST": in.Localhost,
		// The agent reports this pod's health to discovery (package healthreport), so
		// its endpoint waits for a healthy report (docs/contracts.md).
		"WASMESH_HEALTH_CHECKED": "true",
		"LABELS":                 stringMapAny(in.Labels),
		"ANNOTATIONS":            stringMapAny(in.Annotations),
		"PROXY_CONFIG":           pcJSON,
	}
	if id := in.ProxyConfig.GetMeshId(); id != "" {
		meta["MESH_ID"] = id
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key, ok := strings.CutPrefix(k, "ISTIO_META_")
		if !ok || key == "" || objectKeys[key] {
			continue
		}
		switch key {
		case "INSTANCE_IPS":
			continue // merged above, INSTANCE_IP first
		case "POD_PORTS":
			var ports []map[string]any
			if err := json.Unmarshal([]byte(env[k]), &ports); err != nil {
				return nil, fmt.Errorf("ISTIO_META_POD_PORTS: not a JSON list of container ports: %w", err)
			}
		}
		meta[key] = env[k]
	}
	meta["INTERCEPTION_MODE"] = mode
	return meta, nil
}

func stringMapAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// EnvMap reads KEY=VALUE entries (os.Environ()'s form) into a map; entries without "="
// are left out.
func EnvMap(env []string) map[string]string {
	out := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

func protoToMap(pc *meshconfig.ProxyConfig) (map[string]any, error) {
	b, err := protojson.Marshal(pc)
	if err != nil {
		return nil, fmt.Errorf("ProxyConfig: %w", err)
	}
	out := map[string]any{}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("ProxyConfig: %w", err)
	}
	return out, nil
}

// InputFromEnv fills the fields of Input that come from the agent's environment:
// POD_NAME, POD_NAMESPACE, INSTANCE_IP, SERVICE_ACCOUNT, WASMESH_LOCALHOST,
// WASMESH_WILDCARD, and Env itself for ISTIO_META_*.
func InputFromEnv(env []string) Input {
	m := EnvMap(env)
	return Input{
		PodName:        m["POD_NAME"],
		PodNamespace:   m["POD_NAMESPACE"],
		InstanceIP:     m["INSTANCE_IP"],
		ServiceAccount: m["SERVICE_ACCOUNT"],
		Localhost:      m["WASMESH_LOCALHOST"],
		Wildcard:       m["WASMESH_WILDCARD"],
		Env:            env,
	}
}
