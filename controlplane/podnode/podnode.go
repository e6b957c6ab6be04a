// Package podnode gives the xDS node a pod's sidecar presents to discovery, offline: the
// injector's template decides the proxy's environment (package inject), and the node id and
// metadata are filled from it and the pod as the agent fills them (docs/contracts.md).
package podnode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/inject"
)

// Defaults of the agent (agent/bootstrap) for what a pod does not say.
const (
	clusterID = "Kubernetes"
	meshID    = "cluster.local"
	domain    = "svc.cluster.local"
)

// ParsePod reads one Pod from YAML or JSON; another kind, or a pod without the address its
// proxy would register (status.podIP), is an error naming what is missing.
func ParsePod(file string, data []byte) (*corev1.Pod, error) {
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(data, &pod); err != nil {
		return nil, fmt.Errorf("%s: not a Pod: %w", file, err)
	}
	if pod.Kind != "Pod" {
		return nil, fmt.Errorf("%s: kind %q: want a Pod (its labels, namespace, service account and IP make the proxy's node)", file, pod.Kind)
	}
	if pod.Name == "" {
		return nil, fmt.Errorf("%s: metadata.name: missing", file)
	}
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("%s: status.podIP: missing (the proxy's address: its inbound listeners and endpoint)", file)
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	return &pod, nil
}

// ParsePods reads the Pods of a multi-document YAML file (each as ParsePod reads one).
func ParsePods(file string, data []byte) ([]*corev1.Pod, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var pods []*corev1.Pod
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, n, err)
		}
		if blank(doc) {
			continue
		}
		pod, err := ParsePod(fmt.Sprintf("%s: document %d", file, n), doc)
		if err != nil {
			return nil, err
		}
		pods = append(pods, pod)
	}
	if len(pods) == 0 {
		return nil, fmt.Errorf("%s: no Pod", file)
	}
	return pods, nil
}

// blank reports whether a document holds only comments and space.
func blank(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			return false
		}
	}
	return true
}

// Node is the node the sidecar of pod presents: the injector's template (cfg, mesh) gives
// the proxy's environment, whose ISTIO_META_* become metadata; the agent's own keys come
// from the pod (name, namespace, labels and annotations after injection, service account,
// IPs). A pod the injector skips or refuses is an error saying why.
func Node(cfg *inject.Config, mesh *meshconfig.MeshConfig, pod *corev1.Pod) (*core.Node, error) {
	res, err := inject.Inject(cfg, mesh, inject.Input{Pod: pod, Namespace: pod.Namespace, Workload: inject.WorkloadOfPod(pod), Offline: true})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	injected := pod
	if res.Pod != nil {
		injected = res.Pod
	} else if !strings.Contains(res.Skipped, "already injected") {
		return nil, fmt.Errorf("pod %s/%s gets no sidecar: %s", pod.Namespace, pod.Name, res.Skipped)
	}
	proxy := findProxy(injected)
	if proxy == nil {
		return nil, fmt.Errorf("pod %s/%s: no %s container", pod.Namespace, pod.Name, inject.ProxyContainer)
	}
	env := resolveEnv(injected, proxy.Env)
	md, err := metadata(injected, env)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	st, err := structpb.NewStruct(md)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: node metadata: %w", pod.Namespace, pod.Name, err)
	}
	id := fmt.Sprintf("sidecar~%s~%s.%s~%s.%s", pod.Status.PodIP, pod.Name, pod.Namespace, pod.Namespace, domain)
	return &core.Node{Id: id, Cluster: serviceCluster(injected), Metadata: st}, nil
}

func findProxy(pod *corev1.Pod) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == inject.ProxyContainer {
				return &list[i]
			}
		}
	}
	return nil
}

// resolveEnv gives the proxy's environment as the kubelet would: values, and the downward
// API fields the template reads (others are left out).
func resolveEnv(pod *corev1.Pod, vars []corev1.EnvVar) map[string]string {
	fields := map[string]string{
		"metadata.name": pod.Name, "metadata.namespace": pod.Namespace, "status.podIP": pod.Status.PodIP,
		"status.hostIP": pod.Status.HostIP, "spec.serviceAccountName": serviceAccount(pod), "spec.nodeName": pod.Spec.NodeName,
	}
	out := map[string]string{}
	for _, v := range vars {
		switch {
		case v.ValueFrom == nil:
			out[v.Name] = v.Value
		case v.ValueFrom.FieldRef != nil:
			if f, ok := fields[v.ValueFrom.FieldRef.FieldPath]; ok {
				out[v.Name] = f
			}
		}
	}
	return out
}

func serviceAccount(pod *corev1.Pod) string {
	if pod.Spec.ServiceAccountName != "" {
		return pod.Spec.ServiceAccountName
	}
	return "default"
}

// objectKeys are the metadata the agent fills with JSON objects, never from ISTIO_META_*.
var objectKeys = map[string]bool{"LABELS": true, "ANNOTATIONS": true, "PROXY_CONFIG": true}

// metadata is the agent's node metadata (docs/contracts.md): every ISTIO_META_<KEY> of the
// environment as <KEY>, then the keys the agent fills itself.
func metadata(pod *corev1.Pod, env map[string]string) (map[string]any, error) {
	md := map[string]any{}
	for k, v := range env {
		if key, ok := strings.CutPrefix(k, "ISTIO_META_"); ok && key != "" && !objectKeys[key] {
			md[key] = v
		}
	}
	if v, ok := md["POD_PORTS"].(string); ok {
		var ports []map[string]any
		if err := json.Unmarshal([]byte(v), &ports); err != nil {
			return nil, fmt.Errorf("ISTIO_META_POD_PORTS: not a JSON list of container ports: %w", err)
		}
	}
	workload := inject.WorkloadOfPod(pod)
	if w := env["ISTIO_META_WORKLOAD_NAME"]; w != "" {
		workload.Name = w
	}
	ips := []string{pod.Status.PodIP}
	for _, ip := range pod.Status.PodIPs {
		if ip.IP != pod.Status.PodIP {
			ips = append(ips, ip.IP)
		}
	}
	mode := env["ISTIO_META_INTERCEPTION_MODE"]
	if mode == "" {
		mode = "REDIRECT"
	}
	for k, v := range map[string]any{
		"NAME": pod.Name, "NAMESPACE": pod.Namespace, "WORKLOAD_NAME": workload.Name, "SERVICE_ACCOUNT": serviceAccount(pod),
		"INSTANCE_IPS": strings.Join(ips, ","), "INTERCEPTION_MODE": mode, "WASMESH_HEALTH_CHECKED": "true",
		"LABELS": anyMap(pod.Labels), "ANNOTATIONS": anyMap(pod.Annotations),
	} {
		md[k] = v
	}
	if _, ok := md["CLUSTER_ID"]; !ok || md["CLUSTER_ID"] == "" {
		md["CLUSTER_ID"] = clusterID
	}
	if _, ok := md["MESH_ID"]; !ok {
		md["MESH_ID"] = meshID
	}
	if pc := env["PROXY_CONFIG"]; pc != "" {
		var obj map[string]any
		if err := json.Unmarshal([]byte(pc), &obj); err != nil {
			return nil, errors.New("PROXY_CONFIG: not a JSON object")
		}
		md["PROXY_CONFIG"] = obj
	}
	return md, nil
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// serviceCluster is the node's cluster, Istio's default: <app label or workload>.<namespace>.
func serviceCluster(pod *corev1.Pod) string {
	name := pod.Labels["app"]
	if name == "" {
		name = inject.WorkloadOfPod(pod).Name
	}
	return name + "." + pod.Namespace
}
