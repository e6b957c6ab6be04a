package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// InterceptionMode says how traffic reaches the proxy (node metadata INTERCEPTION_MODE).
type InterceptionMode string

// REDIRECT is iptables capture (virtual listeners on 15001/15006); NONE is the local mesh,
// where listeners bind where traffic is sent.
const (
	InterceptionRedirect InterceptionMode = "REDIRECT"
	InterceptionNone     InterceptionMode = "NONE"
)

// PodPort is one entry of POD_PORTS, Kubernetes' container port shape.
type PodPort struct {
	Name          string `json:"name,omitempty"`
	ContainerPort uint32 `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
}

// Proxy is a connected xDS client as it described itself in its node.
type Proxy struct {
	ID          string
	Type        string // "sidecar" or "router"
	IPAddresses []string
	DNSDomain   string

	Name             string
	Namespace        string
	WorkloadName     string
	Labels           map[string]string
	ServiceAccount   string
	InterceptionMode InterceptionMode
	Localhost        string
	PodPorts         []PodPort
	IstioVersion     string
	ClusterID        string
	Generator        string
	// HealthChecked: the agent reports this workload's health over an istio.io/health
	// stream (WASMESH_HEALTH_CHECKED), so it starts unhealthy until a report says otherwise.
	HealthChecked bool
	Locality      *core.Locality
	Metadata      *structpb.Struct
}

// IP returns the proxy's primary address.
func (p *Proxy) IP() string {
	if len(p.IPAddresses) == 0 {
		return ""
	}
	return p.IPAddresses[0]
}

// ParseNode reads a proxy from its xDS node: the node id
// "<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>" and the metadata keys of
// docs/contracts.md. Metadata wins over what the id implies.
func ParseNode(node *core.Node) (*Proxy, error) {
	if node == nil || node.GetId() == "" {
		return nil, errors.New("node id is required")
	}
	parts := strings.Split(node.GetId(), "~")
	if len(parts) != 4 {
		return nil, fmt.Errorf("node id %q: want 4 parts separated by ~ (type~ip~pod.namespace~domain)", node.GetId())
	}
	p := &Proxy{ID: node.GetId(), Type: parts[0], DNSDomain: parts[3], Metadata: node.GetMetadata(), Locality: node.GetLocality()}
	switch p.Type {
	case "sidecar", "router":
	default:
		return nil, fmt.Errorf("node id %q: unknown proxy type %q", node.GetId(), p.Type)
	}
	if _, err := netip.ParseAddr(parts[1]); err != nil {
		return nil, fmt.Errorf("node id %q: %q is not an IP address", node.GetId(), parts[1])
	}
	p.IPAddresses = []string{parts[1]}
	if name, ns, ok := strings.Cut(parts[2], "."); ok {
		p.Name, p.Namespace = name, ns
	} else {
		p.Name = parts[2]
	}
	md := node.GetMetadata().GetFields()
	str := func(k string) string { return md[k].GetStringValue() }
	if v := str("NAME"); v != "" {
		p.Name = v
	}
	if v := str("NAMESPACE"); v != "" {
		p.Namespace = v
	}
	if p.Namespace == "" {
		p.Namespace = "default"
	}
	p.WorkloadName = str("WORKLOAD_NAME")
	p.ServiceAccount = str("SERVICE_ACCOUNT")
	p.IstioVersion = str("ISTIO_VERSION")
	p.ClusterID = str("CLUSTER_ID")
	p.Generator = str("GENERATOR")
	p.HealthChecked = str("WASMESH_HEALTH_CHECKED") == "true"
	p.InterceptionMode = InterceptionRedirect
	if v := str("INTERCEPTION_MODE"); v != "" {
		switch InterceptionMode(strings.ToUpper(v)) {
		case InterceptionRedirect, "TPROXY":
			p.InterceptionMode = InterceptionRedirect
		case InterceptionNone:
			p.InterceptionMode = InterceptionNone
		default:
			return nil, fmt.Errorf("node %q: metadata INTERCEPTION_MODE %q: want REDIRECT or NONE", p.ID, v)
		}
	}
	p.Localhost = "127.0.0.1"
	if v := str("WASMESH_LOCALHOST"); v != "" {
		if _, err := netip.ParseAddr(v); err != nil {
			return nil, fmt.Errorf("node %q: metadata WASMESH_LOCALHOST %q is not an IP address", p.ID, v)
		}
		p.Localhost = v
	}
	if v := str("INSTANCE_IPS"); v != "" {
		var ips []string
		for _, ip := range strings.Split(v, ",") {
			ip = strings.TrimSpace(ip)
			if _, err := netip.ParseAddr(ip); err != nil {
				return nil, fmt.Errorf("node %q: metadata INSTANCE_IPS: %q is not an IP address", p.ID, ip)
			}
			ips = append(ips, ip)
		}
		p.IPAddresses = ips
	}
	if l := md["LABELS"].GetStructValue(); l != nil {
		p.Labels = map[string]string{}
		for k, v := range l.GetFields() {
			p.Labels[k] = v.GetStringValue()
		}
	}
	if v := str("POD_PORTS"); v != "" {
		if err := json.Unmarshal([]byte(v), &p.PodPorts); err != nil {
			return nil, fmt.Errorf("node %q: metadata POD_PORTS: %w", p.ID, err)
		}
	}
	return p, nil
}

// Workload is a running instance that can be an endpoint: an auto-registered proxy.
type Workload struct {
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	Labels         map[string]string `json:"labels"`
	IPs            []string          `json:"ips"`
	ServiceAccount string            `json:"serviceAccount"`
	Ports          map[string]uint32 `json:"ports"` // named ports (POD_PORTS) override service target ports
	Locality       string            `json:"locality"`
	Health         Health            `json:"health"`
}

// Key names the workload in its registry.
func (w *Workload) Key() string { return w.Namespace + "/" + w.Name }

// Equal compares two workloads.
func (w *Workload) Equal(o *Workload) bool {
	if w.Name != o.Name || w.Namespace != o.Namespace || w.ServiceAccount != o.ServiceAccount || w.Health != o.Health ||
		w.Locality != o.Locality || !slices.Equal(w.IPs, o.IPs) || !maps.Equal(w.Labels, o.Labels) || len(w.Ports) != len(o.Ports) {
		return false
	}
	for k, v := range w.Ports {
		if o.Ports[k] != v {
			return false
		}
	}
	return true
}

// Workload returns the proxy as a workload when its metadata carries what auto-registration
// needs: NAME, NAMESPACE, LABELS and INSTANCE_IPS.
func (p *Proxy) Workload() (*Workload, bool) {
	md := p.Metadata.GetFields()
	if md["NAME"].GetStringValue() == "" || md["NAMESPACE"].GetStringValue() == "" ||
		md["LABELS"].GetStructValue() == nil || md["INSTANCE_IPS"].GetStringValue() == "" {
		return nil, false
	}
	w := &Workload{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, IPs: p.IPAddresses, ServiceAccount: p.ServiceAccount}
	if len(p.PodPorts) > 0 {
		w.Ports = map[string]uint32{}
		for _, pp := range p.PodPorts {
			if pp.Name != "" {
				w.Ports[pp.Name] = pp.ContainerPort
			}
		}
	}
	if l := p.Locality; l != nil && l.GetRegion() != "" {
		w.Locality = strings.TrimRight(l.GetRegion()+"/"+l.GetZone()+"/"+l.GetSubZone(), "/")
	}
	return w, true
}

// SortedLabels renders labels as "k=v,k=v" in key order, for cache keys and debug output.
func SortedLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
	}
	return b.String()
}
