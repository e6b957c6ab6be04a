package kubenode

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// configError is a container whose configuration cannot be resolved (a missing ConfigMap
// or key, a field the node does not know): kubelet's CreateContainerConfigError.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &configError{fmt.Sprintf(format, args...)}
}

// containerEnv is the environment of container c as the kubelet makes it: the
// "kubernetes" service's variables, envFrom, then env in order (a value's $(VAR) refers to
// variables defined before it), with mount paths in values rewritten (see mounts.rewrite),
// then PATH, HOME (the machine's) and HOSTNAME (the pod's name) unless set, then the node's
// own variables, which every container gets:
// WASMESH_LOCALHOST (the pod's localhost), WASMESH_WILDCARD (the pod IP), WASMESH_BASE_ID
// (the pod's hot-restart domain), WASMESH_MOUNTS (the container's mounts) and the marker.
func (r *podRun) containerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, m mounts) (map[string]string, error) {
	env := map[string]string{}
	if u, err := url.Parse(r.node.restConfig.Host); err == nil && u.Hostname() != "" {
		// The "kubernetes" Service, whose ClusterIP routes nowhere on loopback, is the API
		// server itself here.
		port := u.Port()
		if port == "" {
			port = "443"
		}
		env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"], env["KUBERNETES_SERVICE_PORT_HTTPS"] = u.Hostname(), port, port
	}
	for _, from := range c.EnvFrom {
		if err := r.envFrom(ctx, pod.Namespace, from, env); err != nil {
			return nil, err
		}
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expand(e.Value, lookup)
			continue
		}
		v, ok, err := r.envValueFrom(ctx, pod, c, e)
		if err != nil {
			return nil, err
		}
		if ok {
			env[e.Name] = v
		}
	}
	for k, v := range env {
		env[k] = m.rewrite(v)
	}
	// The image's environment is the machine's PATH and HOME; the runtime's HOSTNAME is
	// the pod's name.
	for k, v := range map[string]string{"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"), "HOSTNAME": pod.Name} {
		if _, set := env[k]; !set {
			env[k] = v
		}
	}
	env["WASMESH_LOCALHOST"] = r.localhost
	env["WASMESH_WILDCARD"] = r.ip
	env["WASMESH_BASE_ID"] = strconv.Itoa(r.baseID)
	env[EnvMounts] = m.json()
	env[EnvNodeDir] = r.node.dir
	return env, nil
}

func (r *podRun) envFrom(ctx context.Context, ns string, from corev1.EnvFromSource, env map[string]string) error {
	kind, name, opt := "configmap", "", false
	switch {
	case from.ConfigMapRef != nil:
		name, opt = from.ConfigMapRef.Name, optional(from.ConfigMapRef.Optional)
	case from.SecretRef != nil:
		kind, name, opt = "secret", from.SecretRef.Name, optional(from.SecretRef.Optional)
	}
	data, err := r.keyData(ctx, ns, kind, name, opt)
	if err != nil {
		return &configError{err.Error()}
	}
	for k, v := range data {
		if len(validation.IsEnvVarName(from.Prefix+k)) == 0 {
			env[from.Prefix+k] = string(v)
		}
	}
	return nil
}

// keyData is the data of a ConfigMap (with its binary data) or a Secret; an optional one
// that does not exist has none.
func (r *podRun) keyData(ctx context.Context, ns, kind, name string, opt bool) (map[string][]byte, error) {
	var data map[string][]byte
	var err error
	if kind == "secret" {
		var s *corev1.Secret
		if s, err = r.node.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			data = s.Data
		}
	} else {
		var cm *corev1.ConfigMap
		if cm, err = r.node.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			data = map[string][]byte{}
			for k, v := range cm.Data {
				data[k] = []byte(v)
			}
			for k, v := range cm.BinaryData {
				data[k] = v
			}
		}
	}
	if apierrors.IsNotFound(err) && opt {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %q not found: %w", kind, name, err)
	}
	return data, nil
}

// keyRef is one key of a ConfigMap or Secret (env configMapKeyRef, secretKeyRef); ok is
// false for an optional one that is absent.
func (r *podRun) keyRef(ctx context.Context, ns, kind, name, key string, opt bool) (string, bool, error) {
	data, err := r.keyData(ctx, ns, kind, name, opt)
	if err != nil {
		return "", false, &configError{err.Error()}
	}
	v, ok := data[key]
	if !ok && !opt {
		return "", false, configErrorf("couldn't find key %s in %s %s/%s", key, kind, ns, name)
	}
	return string(v), ok, nil
}

func optional(b *bool) bool { return b != nil && *b }

// envValueFrom resolves one valueFrom; ok is false for an optional reference that is
// absent (the variable is then not set).
func (r *podRun) envValueFrom(ctx context.Context, pod *corev1.Pod, c *corev1.Container, e corev1.EnvVar) (string, bool, error) {
	src := e.ValueFrom
	switch {
	case src.FieldRef != nil:
		v, err := r.fieldValue(pod, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := r.resourceValue(pod, c, src.ResourceFieldRef)
		return v, err == nil, err
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		return r.keyRef(ctx, pod.Namespace, "configmap", ref.Name, ref.Key, optional(ref.Optional))
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		return r.keyRef(ctx, pod.Namespace, "secret", ref.Name, ref.Key, optional(ref.Optional))
	}
	return "", false, configErrorf("env %s: a valueFrom the node does not know", e.Name)
}

// fieldValue is a downward-API field of the pod (env fieldRef, downwardAPI volume items).
func (r *podRun) fieldValue(pod *corev1.Pod, path string) (string, error) {
	if key, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.podIPs":
		return r.ip, nil
	case "status.hostIP", "status.hostIPs":
		return r.node.hostIP, nil
	}
	return "", configErrorf("unsupported fieldPath %q", path)
}

// subscript parses "<prefix>['key']".
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok || !strings.HasSuffix(rest, "']") {
		return "", false
	}
	return strings.TrimSuffix(rest, "']"), true
}

// resourceValue is a container's resource request or limit in units of the divisor,
// rounded up; a limit that is not set is the node's allocatable amount, as the kubelet
// gives it.
func (r *podRun) resourceValue(pod *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" {
		c = findContainer(pod, ref.ContainerName)
	}
	if c == nil {
		return "", configErrorf("resourceFieldRef %s: no container %q", ref.Resource, ref.ContainerName)
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", configErrorf("unsupported resource %q", ref.Resource)
	}
	res := corev1.ResourceName(name)
	q := c.Resources.Requests[res]
	if kind == "limits" {
		var set bool
		if q, set = c.Resources.Limits[res]; !set {
			q = r.node.allocatable[res]
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	switch res {
	case corev1.ResourceCPU:
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	case corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
		return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
	}
	return "", configErrorf("unsupported resource %q", ref.Resource)
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}

// environ is env as a process's environment, sorted.
func environ(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
