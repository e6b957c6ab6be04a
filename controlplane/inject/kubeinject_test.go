package inject

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// kube-inject of each golden case's pod gives the golden output: the same template offline.
func TestKubeInjectGivesTheGolden(t *testing.T) {
	m := goldenMesh(t)
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			in, err := os.ReadFile(filepath.Join("testdata/golden", c.name+".in.yaml"))
			require.NoError(t, err)
			var out bytes.Buffer
			var warnings []string
			err = KubeInject(KubeOptions{Mesh: m, Warn: func(w string) { warnings = append(warnings, w) }}, bytes.NewReader(in), &out)
			want := readGolden(t, c.name)
			if want.Error != "" {
				require.Error(t, err)
				assert.Equal(t, "document 1: Pod "+c.pod.Namespace+"/"+c.pod.Name+": "+want.Error, err.Error())
				return
			}
			require.NoError(t, err)
			var got corev1.Pod
			require.NoError(t, yaml.UnmarshalStrict(out.Bytes(), &got))
			if want.Skipped != "" {
				assert.Equal(t, toYAML(t, c.pod), toYAML(t, &got), "a skipped pod is written unchanged")
				return
			}
			assert.Equal(t, toYAML(t, want.Pod), toYAML(t, &got))
			require.Len(t, warnings, len(want.Warnings))
			for i, w := range want.Warnings {
				assert.Equal(t, "Pod "+c.pod.Namespace+"/"+c.pod.Name+": "+w, warnings[i])
			}
		})
	}
}

func readGolden(t *testing.T, name string) goldenOutput {
	data, err := os.ReadFile(filepath.Join("testdata/golden", name+".out.yaml"))
	require.NoError(t, err)
	var g goldenOutput
	require.NoError(t, yaml.UnmarshalStrict(data, &g))
	return g
}

// Every kind that makes pods gets the sidecar in its pod template, named as its workload;
// other objects and comment-only documents pass through; the output is multi-document YAML.
func TestKubeInjectWorkloads(t *testing.T) {
	in, err := os.ReadFile("testdata/workloads.yaml")
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, KubeInject(KubeOptions{}, bytes.NewReader(in), &out))
	docs := strings.Split(out.String(), "---\n")
	require.Len(t, docs, 7, out.String())

	type workload struct {
		obj      any
		template func() *corev1.PodTemplateSpec
		owner    string
	}
	var dep appsv1.Deployment
	var sts appsv1.StatefulSet
	var ds appsv1.DaemonSet
	var job batchv1.Job
	var cron batchv1.CronJob
	cases := []workload{
		{&dep, func() *corev1.PodTemplateSpec { return &dep.Spec.Template }, "kubernetes://apis/apps/v1/namespaces/shop/deployments/web"},
		{&sts, func() *corev1.PodTemplateSpec { return &sts.Spec.Template }, "kubernetes://apis/apps/v1/namespaces/shop/statefulsets/db"},
		{&ds, func() *corev1.PodTemplateSpec { return &ds.Spec.Template }, "kubernetes://apis/apps/v1/namespaces/default/daemonsets/logs"},
		{&job, func() *corev1.PodTemplateSpec { return &job.Spec.Template }, "kubernetes://apis/batch/v1/namespaces/shop/jobs/migrate"},
		{&cron, func() *corev1.PodTemplateSpec { return &cron.Spec.JobTemplate.Spec.Template }, "kubernetes://apis/batch/v1/namespaces/shop/cronjobs/report"},
	}
	for i, c := range cases {
		require.NoError(t, yaml.UnmarshalStrict([]byte(docs[i]), c.obj), docs[i])
		tpl := c.template()
		require.Contains(t, tpl.Annotations, "sidecar.istio.io/status", "document %d", i+1)
		var proxy *corev1.Container
		for j := range tpl.Spec.Containers {
			if tpl.Spec.Containers[j].Name == ProxyContainer {
				proxy = &tpl.Spec.Containers[j]
			}
		}
		require.NotNil(t, proxy, "document %d has no sidecar", i+1)
		env := map[string]string{}
		for _, e := range proxy.Env {
			env[e.Name] = e.Value
		}
		assert.Equal(t, c.owner, env["ISTIO_META_OWNER"])
		assert.Equal(t, "", tpl.Namespace, "the template gets no namespace")
	}
	assert.Equal(t, "web", dep.Spec.Template.Labels["service.istio.io/canonical-name"])
	assert.YAMLEq(t, "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  ports: [{port: 80}]\n", docs[5])
	assert.YAMLEq(t, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\ndata: {a: b}\n", docs[6])
}

// A document that is not a Kubernetes object, or a workload with an unknown field, is an
// error naming the document; nothing past it is written.
func TestKubeInjectBadInput(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"kind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: a, image: x}]}\n---\n- not an object\n", "document 2: not a Kubernetes object"},
		{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1, tempalte: {}}\n", `document 1: Deployment: error unmarshaling JSON: while decoding JSON: json: unknown field "tempalte"`},
		{"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {status.sidecar.istio.io/port: x}\nspec: {containers: [{name: a, image: x}]}\n",
			`document 1: Pod p: invalid value "x" for annotation status.sidecar.istio.io/port`},
	} {
		var out bytes.Buffer
		err := KubeInject(KubeOptions{}, strings.NewReader(c.in), &out)
		require.Error(t, err, c.in)
		assert.True(t, strings.HasPrefix(err.Error(), c.want), "%q does not start with %q", err.Error(), c.want)
	}
}
