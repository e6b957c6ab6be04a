package kube

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// Annotations and labels Istio reads on Services, Pods, Nodes and Namespaces.
const (
	annotationExportTo     = "networking.istio.io/exportTo"
	labelPersistentSession = "istio.io/persistent-session" // PILOT_PERSISTENT_SESSION_LABEL's default
	labelLocality          = "istio-locality"              // a pod's own locality, "region.zone.subzone"
	labelRegion            = "topology.kubernetes.io/region"
	labelZone              = "topology.kubernetes.io/zone"
	labelSubzone           = "topology.istio.io/subzone"
	labelNetwork           = "topology.istio.io/network"
	labelCluster           = "topology.istio.io/cluster"
	labelHostname          = "kubernetes.io/hostname"
)

// Hostname is a Service's name in the mesh: <name>.<namespace>.svc.<domain>.
func Hostname(name, namespace, domain string) string {
	return name + "." + namespace + ".svc." + domain
}

// serviceOf is the mesh's view of a Kubernetes Service, as Istio's Kubernetes registry
// converts it: a ClusterIP service is load balanced by the client over its endpoints (EDS);
// a headless one (clusterIP None) is Passthrough, its callers reaching each pod by its own
// address; an ExternalName service is resolved by DNS to the external name and is external
// to the mesh.
func serviceOf(svc *corev1.Service, domain string) *model.Service {
	ms := &model.Service{
		Hostname:   Hostname(svc.Name, svc.Namespace, domain),
		Namespace:  svc.Namespace,
		Name:       svc.Name,
		Resolution: model.ClientSideLB,
		Labels:     svc.Labels,
		ExportTo:   exportTo(svc.Annotations[annotationExportTo]),
		Source:     "kubernetes: Service " + svc.Namespace + "/" + svc.Name,
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.ExternalName != "":
		ms.Resolution, ms.MeshExternal = model.DNSLB, true
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		ms.Resolution = model.Passthrough
	case len(svc.Spec.ClusterIPs) > 0:
		ms.Addresses = slices.Clone(svc.Spec.ClusterIPs)
	case svc.Spec.ClusterIP != "":
		ms.Addresses = []string{svc.Spec.ClusterIP}
	}
	if len(svc.Spec.Selector) > 0 {
		// The pods the Service selects serve its ports (inbound listeners for them). Without
		// a selector a Service selects nothing: its endpoints are managed by hand.
		ms.WorkloadSelector = svc.Spec.Selector
	}
	for _, p := range svc.Spec.Ports {
		mp := model.Port{Name: p.Name, Port: uint32(p.Port), Protocol: portProtocol(p)}
		if svc.Spec.Type != corev1.ServiceTypeExternalName {
			// A named target port is resolved per pod: in its endpoints, and by its proxy
			// for its inbound listener.
			mp.TargetPort, mp.TargetPortName = uint32(p.TargetPort.IntVal), p.TargetPort.StrVal
		}
		ms.Ports = append(ms.Ports, mp)
	}
	slices.SortFunc(ms.Ports, func(a, b model.Port) int { return int(a.Port) - int(b.Port) })
	return ms
}

// portProtocol is Istio's protocol selection for a Service port (kube.ConvertProtocol):
// UDP stays UDP; appProtocol wins over the port name, including Kubernetes' own
// "kubernetes.io/h2c", "kubernetes.io/ws" and "kubernetes.io/wss"; otherwise the name's
// prefix before "-" ("http-web", "grpc"), with "grpc-web" matched whole (model.ParseProtocol).
// Unknown is TCP.
func portProtocol(p corev1.ServicePort) model.Protocol {
	if p.Protocol == corev1.ProtocolUDP {
		return model.UDP
	}
	name := p.Name
	if p.AppProtocol != nil {
		name = *p.AppProtocol
		switch name {
		case "kubernetes.io/h2c":
			return model.HTTP2
		case "kubernetes.io/ws":
			return model.HTTP
		case "kubernetes.io/wss":
			return model.HTTPS
		}
	}
	return model.ParseProtocol("", name)
}

// exportTo reads the networking.istio.io/exportTo annotation: namespaces separated by
// commas ("." its own, "*" every one).
func exportTo(annotation string) []string {
	if strings.TrimSpace(annotation) == "" {
		return nil
	}
	var out []string
	for _, ns := range strings.Split(annotation, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			out = append(out, ns)
		}
	}
	return out
}
