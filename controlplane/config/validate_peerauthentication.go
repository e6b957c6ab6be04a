package config

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
	security "istio.io/api/security/v1beta1"
)

// validatePeerAuthentication applies Istio's rules (pkg/config/validation's
// ValidatePeerAuthentication), each failure naming its field: port-level modes only on a
// policy with a workload selector (a mesh or namespace policy has no ports to name), at
// least one port when the map is given, ports 1-65535, valid selector labels; and the modes
// must be ones the API defines (a number outside the enum decodes without error).
func validatePeerAuthentication(m proto.Message) *FieldError {
	pa := m.(*security.PeerAuthentication)
	root := path("")
	labels := pa.GetSelector().GetMatchLabels()
	if fe := validateSelectorLabels(root.f("selector.matchLabels"), labels, false); fe != nil {
		return fe
	}
	if fe := validateMTLSMode(root.f("mtls.mode"), pa.GetMtls()); fe != nil {
		return fe
	}
	ports := pa.GetPortLevelMtls()
	if ports == nil {
		return nil
	}
	if len(labels) == 0 {
		return root.f("portLevelMtls").err("a mesh-wide or namespace-wide policy (no selector.matchLabels) cannot set port-level mTLS")
	}
	if len(ports) == 0 {
		return root.f("portLevelMtls").err("when given, at least one port is required")
	}
	keys := make([]uint32, 0, len(ports))
	for p := range ports {
		keys = append(keys, p)
	}
	slices.Sort(keys) // the first bad port is the same on every run
	for _, p := range keys {
		field := root.k("portLevelMtls", fmt.Sprint(p))
		if fe := validatePortNumber(string(field), p, false); fe != nil {
			return fe
		}
		if fe := validateMTLSMode(field.f("mode"), ports[p]); fe != nil {
			return fe
		}
	}
	return nil
}

func validateMTLSMode(p path, m *security.PeerAuthentication_MutualTLS) *FieldError {
	if _, ok := security.PeerAuthentication_MutualTLS_Mode_name[int32(m.GetMode())]; !ok {
		return p.err("unknown mode %d (UNSET, DISABLE, PERMISSIVE or STRICT)", m.GetMode())
	}
	return nil
}
