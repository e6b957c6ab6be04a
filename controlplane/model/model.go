// Package model is the control plane's service model: services, ports and endpoints as the
// registries produce them, and proxies as they identify themselves over xDS. Values are
// immutable once published; a change produces new values.
package model

import (
	"maps"
	"slices"
	"sort"
	"strings"
)

// Protocol is a port's application protocol, upper case as Istio spells it.
type Protocol string

// Protocols the generators distinguish.
const (
	HTTP    Protocol = "HTTP"
	HTTP2   Protocol = "HTTP2"
	GRPC    Protocol = "GRPC"
	GRPCWeb Protocol = "GRPC-WEB"
	HTTPS   Protocol = "HTTPS"
	TLS     Protocol = "TLS"
	TCP     Protocol = "TCP"
	UDP     Protocol = "UDP"
	Mongo   Protocol = "MONGO"
	Redis   Protocol = "REDIS"
	MySQL   Protocol = "MYSQL"
)

// ParseProtocol takes the protocol from the port's protocol field, else from its name's
// prefix ("http-web", "grpc"), Istio's explicit protocol selection; unknown means TCP.
func ParseProtocol(protocol, name string) Protocol {
	if protocol != "" {
		return Protocol(strings.ToUpper(protocol))
	}
	lower := strings.ToLower(name)
	// grpc-web is the one protocol with a hyphen in its name: matched whole, before the
	// prefix, as Istio's kube.ConvertProtocol does.
	if strings.HasPrefix(lower, "grpc-web") {
		return GRPCWeb
	}
	prefix, _, _ := strings.Cut(lower, "-")
	switch prefix {
	case "http":
		return HTTP
	case "http2":
		return HTTP2
	case "grpc":
		return GRPC
	case "https":
		return HTTPS
	case "tls":
		return TLS
	case "mongo":
		return Mongo
	case "redis":
		return Redis
	case "mysql":
		return MySQL
	case "udp":
		return UDP
	}
	return TCP
}

// IsHTTP reports whether the protocol is served by an HTTP connection manager.
func (p Protocol) IsHTTP() bool {
	switch p {
	case HTTP, HTTP2, GRPC, GRPCWeb:
		return true
	}
	return false
}

// IsHTTP2 reports whether upstream connections must speak HTTP/2.
func (p Protocol) IsHTTP2() bool { return p == HTTP2 || p == GRPC }

// Resolution is how a proxy finds a service's endpoints.
type Resolution int

// Resolutions map onto Envoy cluster discovery types: EDS, STRICT_DNS, LOGICAL_DNS and
// ORIGINAL_DST.
const (
	ClientSideLB  Resolution = iota // STATIC: endpoints from EDS
	DNSLB                           // DNS: STRICT_DNS
	DNSRoundRobin                   // DNS_ROUND_ROBIN: LOGICAL_DNS
	Passthrough                     // NONE: ORIGINAL_DST
)

func (r Resolution) String() string {
	return [...]string{"STATIC", "DNS", "DNS_ROUND_ROBIN", "NONE"}[r]
}

// MarshalText writes the resolution as Istio spells it (debug output).
func (r Resolution) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// Port is one port of a service.
type Port struct {
	Name       string `json:"name"`
	Port       uint32 `json:"port"`
	TargetPort uint32 `json:"targetPort"` // 0: same as Port
	// TargetPortName names the workload's container port instead (a Kubernetes Service's
	// named targetPort): each pod resolves it through its own ports.
	TargetPortName string   `json:"targetPortName,omitempty"`
	Protocol       Protocol `json:"protocol"`
}

// Service is one host with its ports, from a ServiceEntry (one per host) or another registry.
// Its JSON names (and its ports' and endpoints') are those of /debug/registryz.
type Service struct {
	Hostname     string            `json:"hostname"`
	Namespace    string            `json:"namespace"`
	Name         string            `json:"name"` // the ServiceEntry's name
	Addresses    []string          `json:"addresses"`
	Ports        []Port            `json:"ports"` // sorted by port number
	Resolution   Resolution        `json:"resolution"`
	MeshExternal bool              `json:"meshExternal"`
	ExportTo     []string          `json:"exportTo"`
	Labels       map[string]string `json:"labels"`
	// WorkloadSelector picks the workloads (in Namespace) that serve the service; a proxy
	// it selects gets inbound listeners and clusters for the service's ports.
	WorkloadSelector map[string]string `json:"workloadSelector"`
	// Source names the config or registry that defined the service, for debug output.
	Source string `json:"source"`
}

// Port returns the service port with number n.
func (s *Service) Port(n uint32) (Port, bool) {
	for _, p := range s.Ports {
		if p.Port == n {
			return p, true
		}
	}
	return Port{}, false
}

// Health of an endpoint, Envoy's core.HealthStatus subset.
type Health int

// Health values.
const (
	Healthy Health = iota
	Unhealthy
	Draining
)

func (h Health) String() string { return [...]string{"HEALTHY", "UNHEALTHY", "DRAINING"}[h] }

// Endpoint is one instance of a service port: the address and port traffic is sent to.
type Endpoint struct {
	Address        string            `json:"address"`
	Port           uint32            `json:"port"`        // the endpoint's port (target port)
	ServicePort    uint32            `json:"servicePort"` // the service port this endpoint serves
	Labels         map[string]string `json:"labels"`
	Locality       string            `json:"locality"` // region/zone/subzone
	Network        string            `json:"network"`
	ServiceAccount string            `json:"serviceAccount"`
	Weight         uint32            `json:"weight"`
	Health         Health            `json:"health"`
	// Workload names what the endpoint belongs to ("WorkloadEntry ns/name", "proxy ns/name").
	Workload  string `json:"workload"`
	Namespace string `json:"namespace"`
}

// SortEndpoints orders endpoints by service port, address and port, so output is stable.
func SortEndpoints(eps []*Endpoint) {
	sort.Slice(eps, func(i, j int) bool {
		a, b := eps[i], eps[j]
		if a.ServicePort != b.ServicePort {
			return a.ServicePort < b.ServicePort
		}
		if a.Address != b.Address {
			return a.Address < b.Address
		}
		return a.Port < b.Port
	})
}

// EndpointsEqual compares two endpoint lists element by element.
func EndpointsEqual(a, b []*Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x.Address != y.Address || x.Port != y.Port || x.ServicePort != y.ServicePort || x.Locality != y.Locality ||
			x.Network != y.Network || x.ServiceAccount != y.ServiceAccount || x.Weight != y.Weight ||
			x.Health != y.Health || x.Workload != y.Workload || !maps.Equal(x.Labels, y.Labels) {
			return false
		}
	}
	return true
}

// ServiceEqual compares the parts of two services that shape generated config.
func ServiceEqual(a, b *Service) bool {
	if a == b {
		return true
	}
	if a == nil || b == nil {
		return false
	}
	if a.Hostname != b.Hostname || a.Namespace != b.Namespace || a.Name != b.Name || a.Resolution != b.Resolution ||
		a.MeshExternal != b.MeshExternal || len(a.Ports) != len(b.Ports) || !slices.Equal(a.Addresses, b.Addresses) ||
		!slices.Equal(a.ExportTo, b.ExportTo) || !maps.Equal(a.Labels, b.Labels) ||
		(a.WorkloadSelector == nil) != (b.WorkloadSelector == nil) || !maps.Equal(a.WorkloadSelector, b.WorkloadSelector) {
		return false
	}
	for i := range a.Ports {
		if a.Ports[i] != b.Ports[i] {
			return false
		}
	}
	return true
}

// FindService returns the service of host in services sorted by host, or nil.
func FindService(sorted []*Service, host string) *Service {
	if i, found := searchHost(sorted, host); found {
		return sorted[i]
	}
	return nil
}

// PatchServices brings services sorted by host, a slice the caller owns (published slices
// are never changed), up to date for one host: its service becomes svc, or it is removed
// when svc is nil.
func PatchServices(sorted []*Service, host string, svc *Service) []*Service {
	i, found := searchHost(sorted, host)
	switch {
	case found && svc != nil:
		sorted[i] = svc
	case found:
		sorted = slices.Delete(sorted, i, i+1)
	case svc != nil:
		sorted = slices.Insert(sorted, i, svc)
	}
	return sorted
}

// CompareHosts orders services by host.
func CompareHosts(a, b *Service) int { return strings.Compare(a.Hostname, b.Hostname) }

func searchHost(sorted []*Service, host string) (int, bool) {
	return slices.BinarySearchFunc(sorted, host, func(s *Service, h string) int { return strings.Compare(s.Hostname, h) })
}
