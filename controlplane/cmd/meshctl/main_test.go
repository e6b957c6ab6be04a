package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func run(t *testing.T, stdin string, args ...string) (string, string, error) {
	cmd := newCommand()
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

const deployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: web, image: wasmesh/echo}]
`

// kube-inject reads stdin or a file, takes the mesh config and the injector's values from
// files, writes stdout or a file, and passes warnings on stderr.
func TestKubeInject(t *testing.T) {
	dir := t.TempDir()
	values := filepath.Join(dir, "values.yaml")
	require.NoError(t, os.WriteFile(values, []byte("global: {hub: registry.local/mesh, tag: v9}\n"), 0o644))
	meshFile := filepath.Join(dir, "mesh.yaml")
	require.NoError(t, os.WriteFile(meshFile, []byte("defaultConfig: {discoveryAddress: discovery.mesh:15010}\n"), 0o644))

	out, stderr, err := run(t, deployment, "kube-inject", "-f", "-", "--valuesFile", values, "--meshConfigFile", meshFile)
	require.NoError(t, err)
	assert.Contains(t, out, "image: registry.local/mesh/proxyv2:v9")
	assert.Contains(t, out, `discovery.mesh:15010`)
	assert.Contains(t, stderr, "Warning: Deployment shop/web: terminationGracePeriodSeconds 1 is shorter")

	in := filepath.Join(dir, "in.yaml")
	require.NoError(t, os.WriteFile(in, []byte(deployment), 0o644))
	result := filepath.Join(dir, "out.yaml")
	_, _, err = run(t, "", "kube-inject", "-f", in, "-o", result, "--nativeSidecars", "true")
	require.NoError(t, err)
	written, err := os.ReadFile(result)
	require.NoError(t, err)
	assert.Contains(t, string(written), "restartPolicy: Always", "a native sidecar")
}

func TestKubeInjectErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "values.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("global: {proxy: {statusPort: -1}}\n"), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"kube-inject"}, `required flag(s) "filename" not set`},
		{[]string{"kube-inject", "-f", filepath.Join(dir, "missing.yaml")}, "missing.yaml: no such file or directory"},
		{[]string{"kube-inject", "-f", "-", "--valuesFile", bad}, "values: global.proxy.statusPort: -1 is not a port"},
		{[]string{"kube-inject", "-f", "-", "--nativeSidecars", "auto"}, `--nativeSidecars "auto": want true or false`},
		{[]string{"kube-inject", "-f", "-", "--meshConfigFile", bad}, "values.yaml"},
	} {
		_, _, err := run(t, deployment, c.args...)
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want)
	}
}
