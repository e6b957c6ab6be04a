package analyze

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/source/kube"
)

// Cluster is what analyze reads of a live cluster: the Istio objects the Kubernetes source
// reads (valid ones as configs, rejected ones with their error), and the Services and Pods
// the cross-object checks need (a Service's host, the pods a subset may select).
type Cluster struct {
	Configs  []*config.Config
	Rejected []*config.Error
	Services []*corev1.Service
	Pods     []*corev1.Pod
	// Namespaces are the cluster's namespaces' names.
	Namespaces []string
}

// ReadCluster lists what analyze reads of the cluster cfg reaches, in every namespace (a
// route may name another namespace's host): the Istio objects through the Kubernetes
// source's own listing and translation.
func ReadCluster(ctx context.Context, cfg *rest.Config) (*Cluster, error) {
	cfgs, rejected, err := kube.ListConfigs(ctx, cfg)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	c := &Cluster{Configs: cfgs, Rejected: rejected}
	nss, err := kc.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Namespaces: %w", err)
	}
	for _, n := range nss.Items {
		c.Namespaces = append(c.Namespaces, n.Name)
	}
	svcs, err := kc.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	for i := range svcs.Items {
		c.Services = append(c.Services, &svcs.Items[i])
	}
	pods, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Pods: %w", err)
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			c.Pods = append(c.Pods, p)
		}
	}
	return c, nil
}

// addCluster puts the cluster's objects in the input, before any file's: a file's config or
// Service of the same kind, namespace and name replaces the cluster's (override).
func (in *input) addCluster(c *Cluster) {
	if in.byKind == nil {
		in.byKind = map[config.Kind][]*doc{}
	}
	in.pods = c.Pods
	in.cluster = true
	for _, cfg := range c.Configs {
		d := &doc{cfg: cfg}
		in.docs = append(in.docs, d)
		in.byKind[cfg.Kind] = append(in.byKind[cfg.Kind], d)
	}
	in.clusterRejected = c.Rejected
	in.kubeServices = append(in.kubeServices, c.Services...)
	in.clusterServices = len(in.kubeServices)
}

// overrideCluster drops the cluster's configs, rejected objects and Services that a file
// gives again (valid or not), and reports the cluster's rejected objects left.
func (in *input) overrideCluster() {
	fromFiles := map[config.Key]bool{}
	for _, d := range in.docs {
		if d.file != "" {
			fromFiles[d.cfg.Key()] = true
		}
	}
	for _, k := range in.rejectedKeys {
		fromFiles[k] = true
	}
	for _, e := range in.clusterRejected {
		if e.Key != nil && fromFiles[*e.Key] {
			continue
		}
		m := newMessage(Error, "IST0106", "Schema validation error: %s", fieldError(e))
		if e.Key != nil {
			m.Origin, m.namespace = e.Key.String(), e.Key.Namespace
		}
		in.problems = append(in.problems, m)
	}
	keep := func(d *doc) bool { return d.file != "" || !fromFiles[d.cfg.Key()] }
	in.docs = filter(in.docs, keep)
	for k, docs := range in.byKind {
		in.byKind[k] = filter(docs, keep)
	}
	svcFromFiles := map[string]bool{}
	for _, s := range in.kubeServices[in.clusterServices:] {
		svcFromFiles[s.Namespace+"/"+s.Name] = true
	}
	var svcs []*corev1.Service
	for i, s := range in.kubeServices {
		if i >= in.clusterServices || !svcFromFiles[s.Namespace+"/"+s.Name] {
			svcs = append(svcs, s)
		}
	}
	in.kubeServices = svcs
}

func filter[T any](xs []T, keep func(T) bool) []T {
	out := xs[:0:0]
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

// podInstances are the running pods a Service selects, in its namespace.
func podInstances(pods []*corev1.Pod, svc *corev1.Service) []instance {
	var out []instance
	for _, p := range pods {
		if p.Namespace == svc.Namespace && len(svc.Spec.Selector) > 0 && selects(svc.Spec.Selector, p.Labels) {
			out = append(out, instance{namespace: p.Namespace, labels: p.Labels})
		}
	}
	return out
}
