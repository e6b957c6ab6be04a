package xds

import (
	security "istio.io/api/security/v1beta1"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// MTLSMode is a PeerAuthentication mode as the generators use it: never UNSET once resolved.
type MTLSMode = security.PeerAuthentication_MutualTLS_Mode

// The modes.
const (
	MTLSUnset      = security.PeerAuthentication_MutualTLS_UNSET
	MTLSDisable    = security.PeerAuthentication_MutualTLS_DISABLE
	MTLSPermissive = security.PeerAuthentication_MutualTLS_PERMISSIVE
	MTLSStrict     = security.PeerAuthentication_MutualTLS_STRICT
)

// defaultRootNamespace is MeshConfig.rootNamespace when unset, as istiod's.
const defaultRootNamespace = "istio-system"

// PeerModes is the mutual TLS a workload accepts: its mode, and the ports whose mode its
// workload policy sets apart. Policies (Istio's pilot/pkg/model/authentication.go): the
// mesh's (root namespace, no selector), then the namespace's (no selector), then the
// workload's (a selector matching it, in its namespace); each level's UNSET inherits the
// level above, and with nothing set anywhere the mode is PERMISSIVE. A port-level mode of
// the workload's policy (keyed by the workload port) overrides it for that port, UNSET
// inheriting the workload's. Of several policies at one level, the oldest counts
// (namespacePolicy).
type PeerModes struct {
	Mode  MTLSMode
	Ports map[uint32]MTLSMode
	// Policies names the configs that decided (mesh, namespace, workload), for debug output.
	Policies []string
}

// Port is the mode of one workload port.
func (m PeerModes) Port(port uint32) MTLSMode {
	if pm, ok := m.Ports[port]; ok {
		return pm
	}
	return m.Mode
}

// PeerAuthenticationFor resolves the policies that apply to a workload in ns with labels. A
// workload without labels (a service without a selector) gets the namespace's mode.
func PeerAuthenticationFor(snap *Snapshot, ns string, labels map[string]string) PeerModes {
	root := snap.Mesh.GetRootNamespace()
	if root == "" {
		root = defaultRootNamespace
	}
	out := PeerModes{Mode: MTLSPermissive}
	apply := func(c *config.Config) *security.PeerAuthentication {
		if c == nil {
			return nil
		}
		pa := c.Spec.(*security.PeerAuthentication)
		out.Policies = append(out.Policies, c.Namespace+"/"+c.Name)
		if m := pa.GetMtls().GetMode(); m != MTLSUnset {
			out.Mode = m
		}
		return pa
	}
	apply(namespacePolicy(snap, root))
	if ns != root {
		apply(namespacePolicy(snap, ns))
	}
	wl := apply(workloadPolicy(snap, ns, labels))
	for port, pm := range wl.GetPortLevelMtls() {
		if m := pm.GetMode(); m != MTLSUnset {
			if out.Ports == nil {
				out.Ports = map[uint32]MTLSMode{}
			}
			out.Ports[port] = m
		}
	}
	return out
}

// namespacePolicy is the namespace's policy without a selector: of several, the oldest
// (creationTimestamp; a config without one, from a file, counts as oldest), then the first
// by name, Istio's order.
func namespacePolicy(snap *Snapshot, ns string) *config.Config {
	return oldestPolicy(snap, ns, func(sel map[string]string) bool { return len(sel) == 0 })
}

// workloadPolicy is the policy of ns whose selector matches labels, the oldest of several
// as namespacePolicy's.
func workloadPolicy(snap *Snapshot, ns string, labels map[string]string) *config.Config {
	if len(labels) == 0 {
		return nil
	}
	return oldestPolicy(snap, ns, func(sel map[string]string) bool { return len(sel) > 0 && config.SelectorMatches(sel, labels) })
}

func oldestPolicy(snap *Snapshot, ns string, match func(selector map[string]string) bool) *config.Config {
	var best *config.Config
	for _, c := range snap.Configs.Namespace(config.PeerAuthentication, ns) { // by name
		if match(c.Spec.(*security.PeerAuthentication).GetSelector().GetMatchLabels()) && (best == nil || c.Created.Before(best.Created)) {
			best = c
		}
	}
	return best
}

// MTLSReport is the mutual TLS a proxy's inbound ports accept, as `istioctl x describe`
// shows it: for debug pages.
type MTLSReport struct {
	// Generated is the MTLS option: without it no TLS is generated, whatever the policies.
	Generated bool       `json:"generated"`
	Mode      string     `json:"workloadMode"`
	Policies  []string   `json:"policies"` // the PeerAuthentications that decided
	Ports     []PortMTLS `json:"ports"`
}

// PortMTLS is one inbound port's mode.
type PortMTLS struct {
	Port     uint32 `json:"port"`
	Protocol string `json:"protocol"`
	Mode     string `json:"mode"`
}

// InboundMTLS reports the proxy's effective modes.
func InboundMTLS(v *View) MTLSReport {
	m := peerModes(v)
	out := MTLSReport{Generated: v.Snapshot.Options.MTLS, Mode: m.Mode.String(), Policies: m.Policies, Ports: []PortMTLS{}}
	if out.Policies == nil {
		out.Policies = []string{}
	}
	for _, in := range v.Inbounds {
		out.Ports = append(out.Ports, PortMTLS{Port: in.Port, Protocol: string(in.Protocol), Mode: m.Port(in.Port).String()})
	}
	return out
}
