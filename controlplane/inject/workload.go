package inject

import (
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Workload is what a pod belongs to: the object a user manages (a Deployment, a CronJob,
// the pod itself), named in the proxy's ISTIO_META_WORKLOAD_NAME and ISTIO_META_OWNER.
type Workload struct {
	Name, Namespace  string
	APIVersion, Kind string
}

// owner is ISTIO_META_OWNER, kubernetes://apis/<apiVersion>/namespaces/<ns>/<kind>s/<name>
// ("" when the workload is not known).
func (w Workload) owner(podNamespace string) string {
	if w.APIVersion == "" || w.Name == "" {
		return ""
	}
	ns := w.Namespace
	if ns == "" {
		ns = podNamespace
	}
	if ns == "" {
		ns = "default"
	}
	return "kubernetes://apis/" + w.APIVersion + "/namespaces/" + ns + "/" + strings.ToLower(w.Kind) + "s/" + w.Name
}

// A CronJob's Job is named <cronjob>-<scheduled time in minutes>.
var cronJobName = regexp.MustCompile(`^(.+)-\d{8,10}$`)

// WorkloadOfPod guesses a pod's workload from its controller, as Istio's
// GetDeployMetaFromPod does: a ReplicaSet named <deployment>-<pod-template-hash> is its
// Deployment's, a Job named <cronjob>-<timestamp> its CronJob's, another controller
// itself; a pod without one (or with a name of its own) is its own workload.
func WorkloadOfPod(pod *corev1.Pod) Workload {
	w := Workload{Name: pod.Name, Namespace: pod.Namespace, APIVersion: "v1", Kind: "Pod"}
	if pod.GenerateName == "" {
		return w
	}
	for _, ref := range pod.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		w.APIVersion, w.Kind, w.Name = ref.APIVersion, ref.Kind, ref.Name
		hash := pod.Labels["pod-template-hash"]
		switch {
		case ref.Kind == "ReplicaSet" && hash != "" && strings.HasSuffix(ref.Name, hash):
			w.Name, w.Kind = strings.TrimSuffix(ref.Name, "-"+hash), "Deployment"
		case ref.Kind == "Job":
			if m := cronJobName.FindStringSubmatch(ref.Name); m != nil {
				w.Name, w.Kind, w.APIVersion = m[1], "CronJob", "batch/v1"
			}
		}
		break
	}
	if w.Name == "" {
		w.Name = pod.Name
	}
	return w
}

// workloadName is ISTIO_META_WORKLOAD_NAME: the service.istio.io/workload-name label, else
// the workload's name.
func (p *plan) workloadName() string {
	if v := p.pod.Labels["service.istio.io/workload-name"]; v != "" {
		return v
	}
	return p.wl.Name
}

// canonicalLabels are Istio's canonical service labels, from the first label that says
// (canonical-name: app.kubernetes.io/name, app, the workload; canonical-revision:
// app.kubernetes.io/version, version, "latest"), and the mTLS mode label.
func (p *plan) canonicalLabels() map[string]string {
	first := func(def string, keys ...string) string {
		for _, k := range keys {
			if v := p.pod.Labels[k]; v != "" {
				return v
			}
		}
		return def
	}
	name := first(p.wl.Name, "service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
	if len(name) > 63 {
		name = name[:63]
	}
	return map[string]string{
		"security.istio.io/tlsMode":           first("istio", "security.istio.io/tlsMode"),
		"service.istio.io/canonical-name":     strings.Trim(name, "-_."),
		"service.istio.io/canonical-revision": first("latest", "service.istio.io/canonical-revision", "app.kubernetes.io/version", "version"),
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
