package config

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"google.golang.org/protobuf/proto"
	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
)

// FieldError is a validation failure at a field path below spec (e.g. "ports[0].number").
type FieldError struct {
	Field string
	Err   error
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

func validateDNSLabel(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%q is longer than %d characters", s, max)
	}
	if !dnsLabel.MatchString(s) {
		return fmt.Errorf("%q is not a lowercase DNS name", s)
	}
	return nil
}

var hostLabel = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`)

// validateHost accepts an FQDN or short name, optionally with a leading "*." wildcard.
func validateHost(h string, allowWildcard bool) error {
	if h == "" {
		return errors.New("empty host")
	}
	if h == "*" {
		if allowWildcard {
			return nil
		}
		return errors.New(`"*" is not allowed here`)
	}
	rest := h
	if strings.HasPrefix(h, "*.") {
		if !allowWildcard {
			return fmt.Errorf("wildcard host %q is not allowed here", h)
		}
		rest = h[2:]
	}
	if len(rest) > 253 {
		return fmt.Errorf("host %q is too long", h)
	}
	for _, l := range strings.Split(rest, ".") {
		if !hostLabel.MatchString(l) || len(l) > 63 {
			return fmt.Errorf("invalid host %q", h)
		}
	}
	return nil
}

// Protocols Istio accepts on a port, upper case.
var protocols = map[string]bool{
	"HTTP": true, "HTTPS": true, "HTTP2": true, "GRPC": true, "GRPC-WEB": true, "TCP": true,
	"TLS": true, "UDP": true, "MONGO": true, "REDIS": true, "MYSQL": true,
}

func validatePortNumber(field string, n uint32, allowZero bool) *FieldError {
	if (n == 0 && !allowZero) || n > 65535 {
		return fieldErr(field, "port %d out of range 1-65535", n)
	}
	return nil
}

func validateLabels(field string, labels map[string]string) *FieldError {
	for k, v := range labels {
		if k == "" || len(k) > 317 {
			return fieldErr(field, "invalid label key %q", k)
		}
		if len(v) > 63 {
			return fieldErr(field+"."+k, "label value longer than 63 characters")
		}
	}
	return nil
}

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

func validateWorkloadEntry(m proto.Message) *FieldError {
	return validateWorkloadEntryFields("", m.(*networking.WorkloadEntry))
}

func validateWorkloadEntryFields(prefix string, we *networking.WorkloadEntry) *FieldError {
	join := func(f string) string {
		if prefix == "" {
			return f
		}
		return prefix + "." + f
	}
	if we.GetAddress() == "" && we.GetNetwork() == "" {
		return fieldErr(join("address"), "an address is required")
	}
	for name, n := range we.GetPorts() {
		if fe := validatePortNumber(join("ports."+name), n, false); fe != nil {
			return fe
		}
	}
	if fe := validateLabels(join("labels"), we.GetLabels()); fe != nil {
		return fe
	}
	if w := we.GetWeight(); w > 1<<24 {
		return fieldErr(join("weight"), "weight %d is too large", w)
	}
	return nil
}

func validateWorkloadGroup(m proto.Message) *FieldError {
	wg := m.(*networking.WorkloadGroup)
	if wg.GetTemplate() == nil {
		return fieldErr("template", "a template is required")
	}
	if fe := validateLabels("template.labels", wg.GetTemplate().GetLabels()); fe != nil {
		return fe
	}
	return nil
}

func validateGateway(m proto.Message) *FieldError {
	if len(m.(*networking.Gateway).GetServers()) == 0 {
		return fieldErr("servers", "at least one server is required")
	}
	return nil
}

func validateEnvoyFilter(m proto.Message) *FieldError {
	ef := m.(*networking.EnvoyFilter)
	for i, p := range ef.GetConfigPatches() {
		if p.GetPatch() == nil || p.GetPatch().GetOperation() == networking.EnvoyFilter_Patch_INVALID {
			return fieldErr(fmt.Sprintf("configPatches[%d].patch.operation", i), "an operation is required")
		}
		if p.GetApplyTo() == networking.EnvoyFilter_INVALID {
			return fieldErr(fmt.Sprintf("configPatches[%d].applyTo", i), "applyTo is required")
		}
	}
	return nil
}

func validateWasmPlugin(m proto.Message) *FieldError {
	wp := m.(*extensions.WasmPlugin)
	if wp.GetUrl() == "" {
		return fieldErr("url", "a module URL is required")
	}
	return nil
}
