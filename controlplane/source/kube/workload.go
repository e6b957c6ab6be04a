package kube

import (
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/wasmesh/wasmesh/controlplane/model"
)

// podFacts is what endpoints read of a pod. Endpoints share its labels map: published
// values are never changed.
type podFacts struct {
	labels         map[string]string // the pod's labels with Istio's topology labels added
	serviceAccount string
	locality       string
	network        string
}

func (f *podFacts) equal(o *podFacts) bool {
	return f.serviceAccount == o.serviceAccount && f.locality == o.locality && f.network == o.network &&
		maps.Equal(f.labels, o.labels)
}

// factsOf collects what endpoints read of pod: its locality (its own istio-locality label,
// else its node's), its network (its label, else its namespace's), and its labels with
// the topology labels Istio adds to every endpoint (labelutil.AugmentLabels), so subsets
// and failover priorities can match them.
func factsOf(pod *corev1.Pod, nodeLocality, nsNetwork, clusterID string) *podFacts {
	f := &podFacts{serviceAccount: pod.Spec.ServiceAccountName, locality: podLocality(pod, nodeLocality), network: nsNetwork}
	if n := pod.Labels[labelNetwork]; n != "" {
		f.network = n
	}
	f.labels = make(map[string]string, len(pod.Labels)+6)
	maps.Copy(f.labels, pod.Labels)
	region, zone, subzone := splitLocality(f.locality)
	for k, v := range map[string]string{labelRegion: region, labelZone: zone, labelSubzone: subzone,
		labelCluster: clusterID, labelHostname: pod.Spec.NodeName, labelNetwork: f.network} {
		if v != "" {
			f.labels[k] = v
		}
	}
	return f
}

// podLocality is the pod's istio-locality label ("region.zone.subzone"), else its node's.
func podLocality(pod *corev1.Pod, nodeLocality string) string {
	if l := pod.Labels[labelLocality]; l != "" {
		return strings.TrimRight(strings.ReplaceAll(l, ".", "/"), "/")
	}
	return nodeLocality
}

// nodeLocality is region/zone/subzone from the node's topology labels.
func nodeLocality(node *corev1.Node) string {
	l := node.Labels
	return strings.TrimRight(l[labelRegion]+"/"+l[labelZone]+"/"+l[labelSubzone], "/")
}

func splitLocality(l string) (region, zone, subzone string) {
	parts := strings.SplitN(l, "/", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return parts[0], parts[1], parts[2]
}

// workloadOf is the pod as a workload a ServiceEntry's workloadSelector can select: its
// labels, addresses, service account, named container ports and locality; healthy when
// ready. A pod without an address, or finished, or going away, is none.
func workloadOf(pod *corev1.Pod, f *podFacts) *model.Workload {
	if pod.Status.PodIP == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	w := &model.Workload{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels, ServiceAccount: f.serviceAccount,
		Locality: f.locality, Health: model.Unhealthy}
	if len(pod.Status.PodIPs) > 0 {
		for _, ip := range pod.Status.PodIPs {
			w.IPs = append(w.IPs, ip.IP)
		}
	} else {
		w.IPs = []string{pod.Status.PodIP}
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name != "" {
				if w.Ports == nil {
					w.Ports = map[string]uint32{}
				}
				w.Ports[p.Name] = uint32(p.ContainerPort)
			}
		}
	}
	if pod.DeletionTimestamp == nil && podReady(pod) {
		w.Health = model.Healthy
	}
	return w
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
