package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/wasmesh/wasmesh/controlplane/envoytypes"
)

const translateConfig = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 80, name: http, targetPort: 8080}]
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-vm, namespace: shop}
spec: {address: 10.9.0.1, labels: {app: web, version: vm}}
`

const webPod = `apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  labels: {app: web, version: v1}
spec:
  serviceAccountName: web
  containers:
  - name: web
    image: wasmesh/echo
    ports: [{name: http, containerPort: 8080}]
status:
  podIP: 10.1.0.5
`

// translation is the command's JSON output.
type translation struct {
	Proxy string                       `json:"proxy"`
	CDS   []map[string]json.RawMessage `json:"cds"`
	EDS   []map[string]json.RawMessage `json:"eds"`
	LDS   []map[string]json.RawMessage `json:"lds"`
	RDS   []map[string]json.RawMessage `json:"rds"`
	ECDS  []map[string]json.RawMessage `json:"ecds"`
}

func names(list []map[string]json.RawMessage, field string) []string {
	var out []string
	for _, r := range list {
		var n string
		_ = json.Unmarshal(r[field], &n)
		out = append(out, n)
	}
	return out
}

// x translate with a pod's YAML: the node is the sidecar's (the pod's IP, namespace and
// labels, so its ServiceEntry selects it and its inbound listener is generated); every type
// is printed with its @type, the same bytes on every run; --type and -o yaml narrow and
// reshape it.
func TestTranslateCommandWithPod(t *testing.T) {
	dir := writeConfig(t, "config.yaml", translateConfig)
	pod := filepath.Join(t.TempDir(), "pod.yaml")
	require.NoError(t, os.WriteFile(pod, []byte(webPod), 0o644))
	cache := t.TempDir()

	out, _, err := run(t, "", "x", "translate", dir, "--proxy", pod, "--wasmCacheDir", cache)
	require.NoError(t, err)
	var tr translation
	require.NoError(t, json.Unmarshal([]byte(out), &tr), out)
	assert.Equal(t, "sidecar~10.1.0.5~web-1.shop~shop.svc.cluster.local", tr.Proxy)
	assert.Contains(t, names(tr.CDS, "name"), "outbound|80||web.shop.svc.cluster.local")
	assert.Contains(t, names(tr.CDS, "@type"), "type.googleapis.com/envoy.config.cluster.v3.Cluster")
	assert.Contains(t, names(tr.LDS, "name"), "virtualInbound", "REDIRECT, the injector's default")
	require.Len(t, tr.EDS, 1)
	eds := string(tr.EDS[0]["endpoints"])
	assert.Contains(t, eds, `"10.1.0.5"`, "the pod, registered from its labels")
	assert.Contains(t, eds, `"10.9.0.1"`, "the WorkloadEntry")
	assert.Contains(t, out, `"destinationPort": 8080`, "the inbound chain of the pod's container port")
	assert.Contains(t, eds, `"tlsMode": "istio"`, "the injected pod's labels: it has a sidecar")

	for typ, list := range map[string][]map[string]json.RawMessage{"cds": tr.CDS, "eds": tr.EDS, "lds": tr.LDS, "rds": tr.RDS} {
		for _, r := range list {
			assertValidResource(t, typ, r)
		}
	}

	again, _, err := run(t, "", "x", "translate", dir, "--proxy", pod, "--wasmCacheDir", cache)
	require.NoError(t, err)
	assert.Equal(t, out, again, "deterministic output")

	lds, _, err := run(t, "", "x", "translate", dir, "--proxy", pod, "--type", "lds", "-o", "yaml", "--wasmCacheDir", cache)
	require.NoError(t, err)
	var only map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(lds), &only))
	assert.ElementsMatch(t, []string{"proxy", "lds"}, keys(only))
}

// assertValidResource reads a printed resource back as its @type and runs Envoy's
// validation on it: the printing loses nothing Envoy would check.
func assertValidResource(t *testing.T, typ string, r map[string]json.RawMessage) {
	t.Helper()
	raw, err := json.Marshal(r)
	require.NoError(t, err)
	var a anypb.Any
	require.NoError(t, protojson.Unmarshal(raw, &a), "%s %s", typ, raw)
	m, err := a.UnmarshalNew()
	require.NoError(t, err)
	assert.NoError(t, envoytypes.Validate(m), "%s %s", typ, raw)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// --workload connects other pods' sidecars: a file of several pods, each an endpoint of
// the service selecting it; a file without a pod is an error naming it.
func TestTranslateCommandWorkloads(t *testing.T) {
	dir := writeConfig(t, "config.yaml", translateConfig)
	tmp := t.TempDir()
	client := filepath.Join(tmp, "client.yaml")
	require.NoError(t, os.WriteFile(client, []byte(strings.NewReplacer("web-1", "client-1", "{app: web, version: v1}", "{app: client}",
		"10.1.0.5", "10.1.0.9").Replace(webPod)), 0o644))
	webs := filepath.Join(tmp, "webs.yaml")
	require.NoError(t, os.WriteFile(webs, []byte(webPod+"---\n"+strings.NewReplacer("web-1", "web-2", "10.1.0.5", "10.1.0.6").Replace(webPod)), 0o644))

	out, _, err := run(t, "", "x", "translate", dir, "--proxy", client, "--workload", webs, "--type", "eds", "--wasmCacheDir", tmp)
	require.NoError(t, err)
	var tr translation
	require.NoError(t, json.Unmarshal([]byte(out), &tr))
	require.Len(t, tr.EDS, 1)
	eds := string(tr.EDS[0]["endpoints"])
	for _, ip := range []string{"10.1.0.5", "10.1.0.6", "10.9.0.1"} {
		assert.Contains(t, eds, `"`+ip+`"`)
	}
	assert.NotContains(t, eds, `"10.1.0.9"`, "the client is no web workload")

	empty := filepath.Join(tmp, "empty.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("# nothing\n"), 0o644))
	_, _, err = run(t, "", "x", "translate", dir, "--proxy", client, "--workload", empty)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "empty.yaml: no Pod")
}

// --meshConfig is discovery's mesh config: REGISTRY_ONLY turns the catch-all route into
// block_all.
func TestTranslateCommandMeshConfig(t *testing.T) {
	dir := writeConfig(t, "config.yaml", translateConfig)
	meshFile := filepath.Join(t.TempDir(), "mesh.yaml")
	require.NoError(t, os.WriteFile(meshFile, []byte("outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n"), 0o644))
	proxy := "sidecar~10.1.0.7~client.shop~shop.svc.cluster.local"
	def, _, err := run(t, "", "x", "translate", dir, "--proxy", proxy, "--type", "rds", "--wasmCacheDir", t.TempDir())
	require.NoError(t, err)
	assert.Contains(t, def, `"allow_any"`)
	only, _, err := run(t, "", "x", "translate", dir, "--proxy", proxy, "--type", "rds", "--meshConfig", meshFile, "--wasmCacheDir", t.TempDir())
	require.NoError(t, err)
	assert.Contains(t, only, `"block_all"`)
	assert.NotContains(t, only, `"allow_any"`)
}

// A node id is a proxy too (its namespace from the id, no labels); a bad --proxy, --type or
// -o is an error naming it.
func TestTranslateCommandArguments(t *testing.T) {
	dir := writeConfig(t, "config.yaml", translateConfig)
	cache := t.TempDir()
	out, _, err := run(t, "", "x", "translate", dir, "--proxy", "sidecar~10.1.0.7~client.shop~shop.svc.cluster.local", "--type", "cds",
		"--wasmCacheDir", cache)
	require.NoError(t, err)
	assert.Contains(t, out, "outbound|80||web.shop.svc.cluster.local")

	notPod := filepath.Join(t.TempDir(), "svc.yaml")
	require.NoError(t, os.WriteFile(notPod, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"), 0o644))
	noIP := filepath.Join(t.TempDir(), "pod.yaml")
	require.NoError(t, os.WriteFile(noIP, []byte(strings.Replace(webPod, "podIP: 10.1.0.5", "hostIP: 10.0.0.1", 1)), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--proxy", "web-1"}, `--proxy "web-1": neither a node id`},
		{[]string{"--proxy", notPod}, `kind "Service": want a Pod`},
		{[]string{"--proxy", noIP}, "status.podIP: missing"},
		{[]string{"--proxy", "sidecar~nope~a.b~b.svc", "--wasmCacheDir", cache}, `"nope" is not an IP address`},
		{[]string{"--proxy", "sidecar~10.1.0.7~a.b~b.svc", "--type", "sds"}, `--type "sds"`},
		{[]string{"--proxy", "sidecar~10.1.0.7~a.b~b.svc", "-o", "table"}, `--output "table"`},
	} {
		_, _, err := run(t, "", append([]string{"x", "translate", dir}, c.args...)...)
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want, fmt.Sprint(c.args))
	}
}
