package inject

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/mesh"
)

var update = flag.Bool("update", false, "rewrite the golden output files")

// A golden case is testdata/golden/<name>.in.yaml, a pod, and <name>.out.yaml, what injection
// makes of it: the injected pod with its warnings, "skipped: <reason>", or "error: <message>".
// The name says which a case may produce (skip-*, error-*, else injected), so that -update
// cannot turn an injected case into a refusal unnoticed.
type goldenCase struct {
	name string
	pod  *corev1.Pod
}

func goldenCases(t *testing.T) []goldenCase {
	t.Helper()
	files, err := filepath.Glob("testdata/golden/*.in.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sort.Strings(files)
	var cases []goldenCase
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		pod := &corev1.Pod{}
		require.NoError(t, yaml.UnmarshalStrict(data, pod), f)
		cases = append(cases, goldenCase{name: strings.TrimSuffix(filepath.Base(f), ".in.yaml"), pod: pod})
	}
	return cases
}

// goldenMesh is the mesh config of every case.
func goldenMesh(t testing.TB) *meshconfig.MeshConfig {
	data, err := os.ReadFile("testdata/mesh.yaml")
	require.NoError(t, err)
	m, err := mesh.Parse("testdata/mesh.yaml", data)
	require.NoError(t, err)
	return m
}

// goldenOutput is what a case's .out.yaml holds for a result.
type goldenOutput struct {
	Warnings []string    `json:"warnings,omitempty"`
	Skipped  string      `json:"skipped,omitempty"`
	Error    string      `json:"error,omitempty"`
	Pod      *corev1.Pod `json:"pod,omitempty"`
}

func outputOf(res *Result, err error) goldenOutput {
	if err != nil {
		return goldenOutput{Error: err.Error()}
	}
	return goldenOutput{Warnings: res.Warnings, Skipped: res.Skipped, Pod: res.Pod}
}

// checkGolden compares got with the case's .out.yaml (rewritten with -update), after
// checking that the case produced the kind of result its name allows.
func checkGolden(t *testing.T, name string, got goldenOutput) {
	t.Helper()
	switch {
	case strings.HasPrefix(name, "error-"):
		require.NotEmpty(t, got.Error, "an error case injected or skipped the pod")
	case strings.HasPrefix(name, "skip-"):
		require.Empty(t, got.Error)
		require.NotEmpty(t, got.Skipped, "a skip case was injected")
	default:
		require.Empty(t, got.Error, "not an error case")
		require.NotNil(t, got.Pod, "not a skip case: %s", got.Skipped)
	}
	out, err := yaml.Marshal(got)
	require.NoError(t, err)
	path := filepath.Join("testdata/golden", name+".out.yaml")
	if *update {
		require.NoError(t, os.WriteFile(path, out, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden output: run go test -update")
	require.Equal(t, string(want), string(out), "injection of %s differs from %s", name, path)
}

// TestGolden injects each case's pod as the webhook does (injection enabled in the
// namespace, native sidecars off unless the pod says).
func TestGolden(t *testing.T) {
	m := goldenMesh(t)
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			res, err := Inject(DefaultConfig(), m, Input{Pod: c.pod, Namespace: c.pod.Namespace, Workload: WorkloadOfPod(c.pod)})
			checkGolden(t, c.name, outputOf(res, err))
		})
	}
}
