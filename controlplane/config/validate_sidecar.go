package config

import (
	"net/netip"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// Sidecar is validated field by field, as VirtualService is.

func validateSidecar(m proto.Message) *FieldError {
	sc := m.(*networking.Sidecar)
	root := path("")
	if ws := sc.GetWorkloadSelector(); ws != nil {
		if fe := validateSelectorLabels(root.f("workloadSelector.labels"), ws.GetLabels(), true); fe != nil {
			return fe
		}
	}
	ingressPorts := map[uint32]bool{}
	for i, in := range sc.GetIngress() {
		ip := root.i("ingress", i)
		if in.GetPort() == nil {
			return ip.f("port").err("a port is required")
		}
		if fe := validateSidecarPort(ip.f("port"), in.GetPort()); fe != nil {
			return fe
		}
		if ingressPorts[in.GetPort().GetNumber()] {
			return ip.f("port.number").err("duplicate port %d", in.GetPort().GetNumber())
		}
		ingressPorts[in.GetPort().GetNumber()] = true
		if in.GetTls() != nil {
			return ip.f("tls").unsupported("no server certificates for sidecar ingress listeners")
		}
		if in.GetBind() != "" {
			if _, err := netip.ParseAddr(in.GetBind()); err != nil {
				return ip.f("bind").err("%q is not an IP address", in.GetBind())
			}
		}
		if in.GetCaptureMode() == networking.CaptureMode_NONE && in.GetBind() == "" {
			return ip.f("bind").err("captureMode NONE needs a bind address")
		}
		if fe := validateDefaultEndpoint(ip.f("defaultEndpoint"), in.GetDefaultEndpoint()); fe != nil {
			return fe
		}
		if fe := validateConnectionPool(ip.f("connectionPool"), in.GetConnectionPool()); fe != nil {
			return fe
		}
	}
	catchAll := -1
	egressPorts := map[uint32]bool{}
	for i, eg := range sc.GetEgress() {
		ep := root.i("egress", i)
		if eg.GetPort() == nil {
			if catchAll >= 0 {
				return ep.f("port").err("egress[%d] already has no port; only one egress listener may catch all ports", catchAll)
			}
			catchAll = i
			if eg.GetBind() != "" || eg.GetCaptureMode() != networking.CaptureMode_DEFAULT {
				return ep.f("bind").err("bind and captureMode need a port")
			}
		} else {
			if fe := validateSidecarPort(ep.f("port"), eg.GetPort()); fe != nil {
				return fe
			}
			if egressPorts[eg.GetPort().GetNumber()] {
				return ep.f("port.number").err("duplicate port %d", eg.GetPort().GetNumber())
			}
			egressPorts[eg.GetPort().GetNumber()] = true
		}
		if eg.GetBind() != "" {
			if _, err := netip.ParseAddr(eg.GetBind()); err != nil {
				return ep.f("bind").err("%q is not an IP address", eg.GetBind())
			}
		}
		if eg.GetCaptureMode() == networking.CaptureMode_NONE && eg.GetBind() == "" {
			return ep.f("bind").err("captureMode NONE needs a bind address")
		}
		if len(eg.GetHosts()) == 0 {
			return ep.f("hosts").err("at least one host is required")
		}
		for j, h := range eg.GetHosts() {
			if fe := validateEgressHost(ep.i("hosts", j), h); fe != nil {
				return fe
			}
		}
	}
	if otp := sc.GetOutboundTrafficPolicy(); otp != nil {
		if ep := otp.GetEgressProxy(); ep != nil {
			if otp.GetMode() != networking.OutboundTrafficPolicy_ALLOW_ANY {
				return root.f("outboundTrafficPolicy.egressProxy").err("needs mode ALLOW_ANY")
			}
			if fe := validateDestination(root.f("outboundTrafficPolicy.egressProxy"), ep); fe != nil {
				return fe
			}
			if ep.GetPort() == nil {
				return root.f("outboundTrafficPolicy.egressProxy.port").err("a port is required")
			}
		}
	}
	return validateConnectionPool(root.f("inboundConnectionPool"), sc.GetInboundConnectionPool())
}

func validateSidecarPort(p path, sp *networking.SidecarPort) *FieldError {
	if fe := validatePortNumber(string(p.f("number")), sp.GetNumber(), false); fe != nil {
		return fe
	}
	if sp.GetTargetPort() != 0 {
		return p.f("targetPort").err("not used by Sidecar listeners; remove it")
	}
	if pr := sp.GetProtocol(); pr != "" && !protocols[strings.ToUpper(pr)] {
		return p.f("protocol").err("unknown protocol %q", pr)
	}
	return nil
}

// validateDefaultEndpoint accepts Istio's forms: 127.0.0.1:PORT, 0.0.0.0:PORT, [::1]:PORT,
// [::]:PORT and unix:///path.
func validateDefaultEndpoint(p path, ep string) *FieldError {
	if ep == "" {
		return nil
	}
	if strings.HasPrefix(ep, "unix://") {
		return p.unsupported("unix domain socket endpoints")
	}
	ap, err := netip.ParseAddrPort(ep)
	if err != nil {
		return p.err("%q: want 127.0.0.1:PORT or 0.0.0.0:PORT", ep)
	}
	a := ap.Addr()
	if !a.IsLoopback() && !a.IsUnspecified() {
		return p.err("%q: the address must be a loopback (127.0.0.1, ::1) or unspecified (0.0.0.0, ::) address", ep)
	}
	if ap.Port() == 0 {
		return p.err("%q: a port is required", ep)
	}
	return nil
}

// validateEgressHost checks "namespace/host" with namespace "*", ".", "~" or a name, and host
// "*", "*.suffix" or a DNS name.
func validateEgressHost(p path, h string) *FieldError {
	ns, host, ok := strings.Cut(h, "/")
	if !ok || ns == "" || host == "" {
		return p.err("%q must be namespace/host (e.g. \"./*\", \"istio-system/*\", \"*/reviews.shop.svc.cluster.local\")", h)
	}
	switch ns {
	case "*", ".", "~":
	default:
		if err := validateDNSLabel(ns, 63); err != nil {
			return p.wrap(err)
		}
	}
	if err := validateHost(host, true); err != nil {
		return p.wrap(err)
	}
	return nil
}
