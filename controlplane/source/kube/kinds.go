package kube

import (
	"google.golang.org/protobuf/proto"
	analysisv1alpha1 "istio.io/api/analysis/v1alpha1"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	extensionsv1alpha1 "istio.io/client-go/pkg/apis/extensions/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// istioKind is one Istio custom resource the source watches: where the API server serves
// it, its informer, and how to read an object of it.
type istioKind struct {
	kind                     config.Kind
	group, version, resource string
	informer                 func(istioinformers.SharedInformerFactory) cache.SharedIndexInformer
	// object reads an object of the kind: its metadata, its spec and its status (both
	// within the cached object: read, never changed).
	object func(any) (metav1.Object, proto.Message, istioStatus)
	rest   func(istioclient.Interface) rest.Interface
}

// istioStatus is the part of an Istio object's status the source reads: IstioStatus, or a
// kind's own status holding its fields (ServiceEntryStatus).
type istioStatus interface {
	GetConditions() []*metav1alpha1.IstioCondition
	GetValidationMessages() []*analysisv1alpha1.AnalysisMessageBase
	GetObservedGeneration() int64
}

func (k *istioKind) apiVersion() string { return k.group + "/" + k.version }

// crdName is the name of the kind's CustomResourceDefinition.
func (k *istioKind) crdName() string { return k.resource + "." + k.group }

// DefaultIstioKinds are the Istio kinds the source watches unless told otherwise.
func DefaultIstioKinds() []config.Kind {
	out := make([]config.Kind, len(istioKinds))
	for i, k := range istioKinds {
		out[i] = k.kind
	}
	return out
}

func findKind(kind config.Kind) *istioKind {
	for i := range istioKinds {
		if istioKinds[i].kind == kind {
			return &istioKinds[i]
		}
	}
	return nil
}

// istioKinds lists the kinds the source can watch, each at the version istiod watches.
var istioKinds = []istioKind{
	{config.ServiceEntry, "networking.istio.io", "v1", "serviceentries",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1().ServiceEntries().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1.ServiceEntry)
			return v, &v.Spec, &v.Status
		}, networkingV1},
	{config.WorkloadEntry, "networking.istio.io", "v1", "workloadentries",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1().WorkloadEntries().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1.WorkloadEntry)
			return v, &v.Spec, &v.Status
		}, networkingV1},
	{config.VirtualService, "networking.istio.io", "v1", "virtualservices",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1().VirtualServices().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1.VirtualService)
			return v, &v.Spec, &v.Status
		}, networkingV1},
	{config.DestinationRule, "networking.istio.io", "v1", "destinationrules",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1().DestinationRules().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1.DestinationRule)
			return v, &v.Spec, &v.Status
		}, networkingV1},
	{config.Sidecar, "networking.istio.io", "v1", "sidecars",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1().Sidecars().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1.Sidecar)
			return v, &v.Spec, &v.Status
		}, networkingV1},
	{config.EnvoyFilter, "networking.istio.io", "v1alpha3", "envoyfilters",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Networking().V1alpha3().EnvoyFilters().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*networkingv1alpha3.EnvoyFilter)
			return v, &v.Spec, &v.Status
		}, func(c istioclient.Interface) rest.Interface { return c.NetworkingV1alpha3().RESTClient() }},
	{config.WasmPlugin, "extensions.istio.io", "v1alpha1", "wasmplugins",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Extensions().V1alpha1().WasmPlugins().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*extensionsv1alpha1.WasmPlugin)
			return v, &v.Spec, &v.Status
		}, func(c istioclient.Interface) rest.Interface { return c.ExtensionsV1alpha1().RESTClient() }},
	{config.Telemetry, "telemetry.istio.io", "v1", "telemetries",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Telemetry().V1().Telemetries().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*telemetryv1.Telemetry)
			return v, &v.Spec, &v.Status
		}, func(c istioclient.Interface) rest.Interface { return c.TelemetryV1().RESTClient() }},
	{config.PeerAuthentication, "security.istio.io", "v1", "peerauthentications",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Security().V1().PeerAuthentications().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*securityv1.PeerAuthentication)
			return v, &v.Spec, &v.Status
		}, securityV1},
	{config.AuthorizationPolicy, "security.istio.io", "v1", "authorizationpolicies",
		func(f istioinformers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Security().V1().AuthorizationPolicies().Informer()
		},
		func(o any) (metav1.Object, proto.Message, istioStatus) {
			v := o.(*securityv1.AuthorizationPolicy)
			return v, &v.Spec, &v.Status
		}, securityV1},
}

func networkingV1(c istioclient.Interface) rest.Interface { return c.NetworkingV1().RESTClient() }

func securityV1(c istioclient.Interface) rest.Interface { return c.SecurityV1().RESTClient() }
