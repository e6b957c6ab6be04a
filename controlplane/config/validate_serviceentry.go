package config

import (
	"fmt"
	"net/netip"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

func validateServiceEntry(m proto.Message) *FieldError {
	se := m.(*networking.ServiceEntry)
	if len(se.GetHosts()) == 0 {
		return fieldErr("hosts", "at least one host is required")
	}
	for i, h := range se.GetHosts() {
		if err := validateHost(h, true); err != nil {
			return &FieldError{Field: fmt.Sprintf("hosts[%d]", i), Err: err}
		}
		if h == "*" {
			return fieldErr(fmt.Sprintf("hosts[%d]", i), `"*" is not allowed; use a wildcard domain`)
		}
		if se.GetResolution() == networking.ServiceEntry_DNS && strings.HasPrefix(h, "*") {
			return fieldErr(fmt.Sprintf("hosts[%d]", i), "wildcard host %q needs resolution NONE", h)
		}
	}
	for i, a := range se.GetAddresses() {
		if _, err := netip.ParsePrefix(a); err != nil {
			if _, err := netip.ParseAddr(a); err != nil {
				return fieldErr(fmt.Sprintf("addresses[%d]", i), "%q is not an IP or CIDR", a)
			}
		}
	}
	if len(se.GetPorts()) == 0 {
		return fieldErr("ports", "at least one port is required")
	}
	names := map[string]bool{}
	numbers := map[uint32]bool{}
	for i, p := range se.GetPorts() {
		f := fmt.Sprintf("ports[%d]", i)
		if fe := validatePortNumber(f+".number", p.GetNumber(), false); fe != nil {
			return fe
		}
		if fe := validatePortNumber(f+".targetPort", p.GetTargetPort(), true); fe != nil {
			return fe
		}
		if p.GetName() == "" {
			return fieldErr(f+".name", "a port name is required")
		}
		if names[p.GetName()] {
			return fieldErr(f+".name", "duplicate port name %q", p.GetName())
		}
		if numbers[p.GetNumber()] {
			return fieldErr(f+".number", "duplicate port number %d", p.GetNumber())
		}
		names[p.GetName()], numbers[p.GetNumber()] = true, true
		if p.GetProtocol() != "" && !protocols[strings.ToUpper(p.GetProtocol())] {
			return fieldErr(f+".protocol", "unknown protocol %q", p.GetProtocol())
		}
	}
	if se.GetWorkloadSelector() != nil && len(se.GetEndpoints()) > 0 {
		return fieldErr("workloadSelector", "cannot be used together with endpoints")
	}
	if se.GetWorkloadSelector() != nil {
		if fe := validateLabels("workloadSelector.labels", se.GetWorkloadSelector().GetLabels()); fe != nil {
			return fe
		}
	}
	for i, ep := range se.GetEndpoints() {
		f := fmt.Sprintf("endpoints[%d]", i)
		if fe := validateWorkloadEntryFields(f, ep); fe != nil {
			return fe
		}
		for name := range ep.GetPorts() {
			if !names[name] {
				return fieldErr(f+".ports."+name, "no port named %q in spec.ports", name)
			}
		}
		if se.GetResolution() == networking.ServiceEntry_STATIC && ep.GetAddress() != "" && !strings.HasPrefix(ep.GetAddress(), "unix://") {
			if _, err := netip.ParseAddr(ep.GetAddress()); err != nil {
				return fieldErr(f+".address", "resolution STATIC needs an IP address, got %q", ep.GetAddress())
			}
		}
	}
	return nil
}
