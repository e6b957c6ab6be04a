package kubenode_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/testenv/kubenode"
)

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
}

func resourceEnv(name, container, res, divisor string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
		ContainerName: container, Resource: res, Divisor: resource.MustParse(divisor)}}}
}

// filesPod is a pod using every kind of environment source and volume the node provides.
func filesPod() *corev1.Pod {
	mode := int32(0o400)
	exp := int64(3600)
	downward := func(path, field string) corev1.DownwardAPIVolumeFile {
		return corev1.DownwardAPIVolumeFile{Path: path, FieldRef: &corev1.ObjectFieldSelector{FieldPath: field}}
	}
	// sleep, not a shell, so that what the node gives reaches the process's environment
	// (a shell drops variables whose names are not its own, CM_file.txt).
	main := corev1.Container{Name: "main", Image: "busybox", Command: []string{"sleep", "3600"}}
	main.Resources = corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}
	main.EnvFrom = []corev1.EnvFromSource{{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}}
	main.Env = []corev1.EnvVar{
		fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace"),
		fieldEnv("POD_IP", "status.podIP"), fieldEnv("HOST_IP", "status.hostIP"),
		fieldEnv("NODE", "spec.nodeName"), fieldEnv("SA", "spec.serviceAccountName"),
		fieldEnv("APP", "metadata.labels['app']"), fieldEnv("NOTE", "metadata.annotations['note']"),
		resourceEnv("CPU_LIMIT", "", "limits.cpu", "1"), resourceEnv("CPU_REQUEST_M", "", "requests.cpu", "1m"),
		resourceEnv("MEM_LIMIT_MI", "main", "limits.memory", "1Mi"),
		{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Key: "greeting"}}},
		{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
		{Name: "ADDRESS", Value: "$(POD_NAME).$(POD_NAMESPACE):$(MISSING)"},
		{Name: "ESCAPED", Value: "$$(POD_NAME)"},
		{Name: "DATA_FILE", Value: "/data/x"},
	}
	main.VolumeMounts = []corev1.VolumeMount{{Name: "podinfo", MountPath: "/etc/podinfo"}, {Name: "data", MountPath: "/data"},
		{Name: "conf", MountPath: "/etc/conf"}, {Name: "creds", MountPath: "/etc/creds"}, {Name: "proj", MountPath: "/var/run/secrets/wasmesh"}}
	// The writer's command line names mount paths, which must reach it rewritten, and
	// $(POD_NAME), which must reach it expanded.
	writer := shell("writer", "cat /etc/podinfo/labels > /data/labels.copy && echo $(POD_NAME) > /data/argv && exec sleep 3600")
	writer.Env = []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name")}
	writer.VolumeMounts = main.VolumeMounts[:2]
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "files", Labels: map[string]string{"app": "env", "version": "v1"},
			Annotations: map[string]string{"note": "say \"hi\"\nbye"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{main, writer}, TerminationGracePeriodSeconds: int64p(1),
			Volumes: []corev1.Volume{
				{Name: "podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					downward("labels", "metadata.labels"), downward("annotations", "metadata.annotations"), downward("name", "metadata.name"),
					{Path: "cpu_limit", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "main", Resource: "limits.cpu", Divisor: resource.MustParse("1m")}}}}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds",
					Items: []corev1.KeyToPath{{Key: "password", Path: "pw", Mode: &mode}}}}},
				{Name: "proj", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "wasmesh", ExpirationSeconds: &exp, Path: "token"}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"},
						Items: []corev1.KeyToPath{{Key: "greeting", Path: "greeting"}}}},
					{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{downward("namespace", "metadata.namespace")}}},
				}}}},
			}}}
}

// The environment and files a container gets are what Kubernetes gives it, at the paths
// WASMESH_MOUNTS names; mount paths in its command line and env are rewritten.
func testEnvironment(e *env) {
	t := e.t
	_, err := e.kc.CoreV1().ConfigMaps(e.ns).Create(e.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "conf"},
		Data: map[string]string{"greeting": "hello", "file.txt": "contents"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = e.kc.CoreV1().Secrets(e.ns).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data: map[string][]byte{"password": []byte("s3cret")}}, metav1.CreateOptions{})
	require.NoError(t, err)
	e.createPod(filesPod())
	pod := e.waitPod("files", 2*time.Minute, "Ready", ready)
	env := environOf(t, pid(t, pod, "main"))

	ip := strings.Split(pod.Status.PodIP, ".")
	require.Len(t, ip, 4)
	var net int // the node's block: its address is 127.<net>.255.254
	_, err = fmt.Sscanf(e.node.HostIP(), "127.%d.255.254", &net)
	require.NoError(t, err)
	api, err := url.Parse(e.cluster.Server())
	require.NoError(t, err)
	var mounts map[string]string
	require.NoError(t, json.Unmarshal([]byte(env[kubenode.EnvMounts]), &mounts))
	for name, want := range map[string]string{
		"POD_NAME": "files", "POD_NAMESPACE": e.ns, "POD_IP": pod.Status.PodIP, "HOST_IP": e.node.HostIP(),
		"NODE": e.node.Name(), "SA": "default", "APP": "env", "NOTE": "say \"hi\"\nbye",
		"CPU_LIMIT": "1", "CPU_REQUEST_M": "250", "MEM_LIMIT_MI": "64",
		"GREETING": "hello", "PASSWORD": "s3cret", "CM_greeting": "hello", "CM_file.txt": "contents",
		"ADDRESS": "files." + e.ns + ":$(MISSING)", "ESCAPED": "$(POD_NAME)", "DATA_FILE": filepath.Join(mounts["/data"], "x"),
		"HOSTNAME": "files", "WASMESH_WILDCARD": pod.Status.PodIP,
		"WASMESH_LOCALHOST":       fmt.Sprintf("127.%d.%s.%s", net+10, ip[2], ip[3]),
		"KUBERNETES_SERVICE_HOST": api.Hostname(), "KUBERNETES_SERVICE_PORT": api.Port(),
		kubenode.EnvNodeDir: e.node.Dir(),
	} {
		assert.Equal(t, want, env[name], "$%s", name)
	}
	assert.Equal(t, e.node.HostIP(), pod.Status.HostIP)
	assert.Equal(t, e.node.Name(), pod.Spec.NodeName)
	assert.NotEmpty(t, env["PATH"])
	for _, p := range []string{"/etc/podinfo", "/data", "/etc/conf", "/etc/creds", "/var/run/secrets/wasmesh", "/var/run/secrets/kubernetes.io/serviceaccount"} {
		require.Contains(t, mounts, p)
		require.True(t, strings.HasPrefix(mounts[p], e.node.Dir()), "%s is in the node's directory: %s", p, mounts[p])
	}
	checkFiles(e, pod, mounts)
	checkTokens(e, mounts)

	// A label change reaches the downward-API file, as the kubelet's sync brings it.
	_, err = e.kc.CoreV1().Pods(e.ns).Patch(e.ctx, "files", types.MergePatchType, []byte(`{"metadata":{"labels":{"version":"v2"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
	e.waitFor(time.Minute, "the labels file to follow the label change", func() error {
		if got := read(t, mounts["/etc/podinfo"], "labels"); got != "app=\"env\"\nversion=\"v2\"" {
			return fmt.Errorf("labels file %q", got)
		}
		return nil
	})
	require.NoError(t, e.kc.CoreV1().Pods(e.ns).Delete(e.ctx, "files", metav1.DeleteOptions{}))
	e.waitGone("files")
}

func read(t require.TestingT, dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	require.NoError(t, err)
	return string(b)
}

func checkFiles(e *env, pod *corev1.Pod, mounts map[string]string) {
	t := e.t
	podDir := mounts["/etc/podinfo"]
	labels := read(t, podDir, "labels")
	assert.Equal(t, "app=\"env\"\nversion=\"v1\"", labels, "Kubernetes' format: sorted, quoted, no newline at the end")
	assert.Equal(t, "note=\"say \\\"hi\\\"\\nbye\"", read(t, podDir, "annotations"))
	parsed, err := podinfo.Read(podDir)
	require.NoError(t, err, "the agent reads the files")
	assert.Equal(t, pod.Labels, parsed.Labels)
	assert.Equal(t, pod.Annotations, parsed.Annotations)
	assert.Equal(t, "files", read(t, podDir, "name"))
	assert.Equal(t, "500", read(t, podDir, "cpu_limit"))
	link, err := os.Readlink(filepath.Join(podDir, "labels"))
	require.NoError(t, err)
	assert.Equal(t, "..data/labels", link, "written as the kubelet's atomic writer does")

	e.waitFor(time.Minute, "the writer's files", func() error {
		_, err := os.Stat(filepath.Join(mounts["/data"], "argv"))
		return err
	})
	assert.Equal(t, labels, read(t, mounts["/data"], "labels.copy"), "the command line's mount paths are rewritten")
	assert.Equal(t, "files\n", read(t, mounts["/data"], "argv"), "$(VAR) in the command line is expanded")
	assert.Equal(t, "hello", read(t, mounts["/etc/conf"], "greeting"))
	assert.Equal(t, "contents", read(t, mounts["/etc/conf"], "file.txt"))
	assert.Equal(t, "s3cret", read(t, mounts["/etc/creds"], "pw"))
	st, err := os.Stat(filepath.Join(mounts["/etc/creds"], "pw"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o400), st.Mode().Perm())
	assert.Equal(t, "hello", read(t, mounts["/var/run/secrets/wasmesh"], "greeting"))
	assert.Equal(t, e.ns, read(t, mounts["/var/run/secrets/wasmesh"], "namespace"))
	sa := mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
	ca, err := os.ReadFile(e.cluster.CAFile())
	require.NoError(t, err)
	assert.Equal(t, string(ca), read(t, sa, "ca.crt"), "the service account volume the API server added")
	assert.Equal(t, e.ns, read(t, sa, "namespace"))
}

// checkTokens checks the projected service-account tokens: the audience and lifetime
// asked for, bound to the pod.
func checkTokens(e *env, mounts map[string]string) {
	t := e.t
	claims := func(tok string) map[string]any {
		parts := strings.Split(tok, ".")
		require.Len(t, parts, 3, "a JWT")
		b, err := base64.RawURLEncoding.DecodeString(parts[1])
		require.NoError(t, err)
		var c map[string]any
		require.NoError(t, json.Unmarshal(b, &c))
		return c
	}
	c := claims(read(t, mounts["/var/run/secrets/wasmesh"], "token"))
	assert.Equal(t, []any{"wasmesh"}, c["aud"])
	assert.Equal(t, "system:serviceaccount:"+e.ns+":default", c["sub"])
	assert.InDelta(t, 3600, c["exp"].(float64)-c["iat"].(float64), 1)
	k8s, _ := c["kubernetes.io"].(map[string]any)
	podClaim, _ := k8s["pod"].(map[string]any)
	assert.Equal(t, "files", podClaim["name"], "bound to the pod")
	c = claims(read(t, mounts["/var/run/secrets/kubernetes.io/serviceaccount"], "token"))
	assert.Equal(t, "system:serviceaccount:"+e.ns+":default", c["sub"])
}
