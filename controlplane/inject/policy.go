package inject

import (
	"encoding/json"
	"fmt"
	"slices"

	"istio.io/api/annotation"
	"istio.io/api/label"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// IgnoredNamespaces are never injected, whatever their labels (Istio's list: the
// Kubernetes system namespaces and kind's storage provisioner).
var IgnoredNamespaces = []string{"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}

// decision is whether a pod is injected, and why not.
type decision struct {
	inject   bool
	reason   string   // why not
	warnings []string // what the user should know either way
}

// required decides a pod the webhook is called for, as Istio's injectRequired does after
// the webhook configuration's selectors chose to call it (see README.md: the namespace
// label istio-injection and the pod label sidecar.istio.io/inject select what is sent):
//
//  1. a pod with host networking, or in an ignored namespace, is never injected;
//  2. the pod's own word: the label sidecar.istio.io/inject, else the annotation of that
//     name ("true" or "false"; another value is warned about and counts as none);
//  3. without it, the first matching neverInjectSelector leaves it alone, else the first
//     matching alwaysInjectSelector injects it;
//  4. else the policy: enabled injects, disabled does not.
//
// Offline (kube-inject), the namespace is unknown: the policy is enabled and the selectors
// are not consulted, as istioctl does.
func required(cfg *Config, meta *metav1.ObjectMeta, spec *corev1.PodSpec, namespace string, offline bool) decision {
	if spec.HostNetwork {
		return decision{reason: "the pod uses the host's network"}
	}
	if slices.Contains(IgnoredNamespaces, namespace) {
		return decision{reason: "namespace " + namespace + " is never injected"}
	}
	var d decision
	word, from := meta.Annotations[annotation.SidecarInject.Name], "annotation"
	if v, ok := meta.Labels[label.SidecarInject.Name]; ok {
		word, from = v, "label" // the label is Istio's newer API and wins
	}
	switch word {
	case "true":
		return decision{inject: true}
	case "false":
		return decision{reason: fmt.Sprintf("the pod's %s %s is false", from, label.SidecarInject.Name)}
	case "":
	default:
		d.warnings = append(d.warnings, fmt.Sprintf("%s %s=%q is neither true nor false: the injection policy decides",
			from, label.SidecarInject.Name, word))
	}
	policy := cfg.Policy
	if offline {
		policy = PolicyEnabled
	} else {
		if i := firstMatch(cfg.NeverInjectSelector, meta.Labels); i >= 0 {
			d.reason = fmt.Sprintf("the pod's labels match neverInjectSelector[%d]", i)
			return d
		}
		if firstMatch(cfg.AlwaysInjectSelector, meta.Labels) >= 0 {
			d.inject = true
			return d
		}
	}
	if policy == PolicyDisabled {
		d.reason = "the injection policy is disabled and the pod does not ask for a sidecar"
		return d
	}
	d.inject = true
	return d
}

// firstMatch is the index of the first selector matching labels (-1: none). Empty
// selectors match nothing, as in Istio.
func firstMatch(selectors []metav1.LabelSelector, lbls map[string]string) int {
	for i := range selectors {
		sel, err := metav1.LabelSelectorAsSelector(&selectors[i])
		if err != nil || sel.Empty() {
			continue // ParseConfig refused bad ones
		}
		if sel.Matches(labels.Set(lbls)) {
			return i
		}
	}
	return -1
}

// Status is the sidecar.istio.io/status annotation of an injected pod: what the injector
// added, so that tools (and the injector itself) know the pod is injected.
type Status struct {
	InitContainers   []string `json:"initContainers"`
	Containers       []string `json:"containers"`
	Volumes          []string `json:"volumes"`
	ImagePullSecrets []string `json:"imagePullSecrets"`
	Revision         string   `json:"revision"`
}

// injected reads the status annotation: a pod that has one is not injected again. One that
// is not the injector's JSON is refused, rather than guessed at.
func injected(meta *metav1.ObjectMeta) (bool, error) {
	v, ok := meta.Annotations[annotation.SidecarStatus.Name]
	if !ok {
		return false, nil
	}
	var st Status
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return false, annotationError(annotation.SidecarStatus.Name, v, fmt.Errorf("not the injector's status (JSON with initContainers, containers, volumes): %w", err))
	}
	return true, nil
}
