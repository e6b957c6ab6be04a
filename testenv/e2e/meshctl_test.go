package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

// meshctlBinary is bin/meshctl, built by `make build`.
func meshctlBinary(t *testing.T) string {
	bin, _ := meshtest.Binaries(t)
	path := filepath.Join(bin, "meshctl")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("WASMESH_REQUIRE_FIXTURES") != "" {
			t.Fatalf("meshctl missing in %s: %v", bin, err)
		}
		t.Skipf("meshctl missing in %s: run `make build`", bin)
	}
	return path
}

// meshctl runs the binary and returns its standard output; a failure fails the test with
// its standard error.
func meshctl(t *testing.T, ctx context.Context, bin string, args ...string) string {
	t.Helper()
	out, stderr, err := meshctlRun(ctx, bin, args...)
	require.NoError(t, err, "meshctl %s: %s", strings.Join(args, " "), stderr)
	return out
}

func meshctlRun(ctx context.Context, bin string, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// tableRows splits a tabwriter table into rows of cells (cells are separated by two spaces
// or more; "NOT SENT" stays one cell), keyed by the first cell.
func tableRows(table string) map[string][]string {
	rows := map[string][]string{}
	sep := regexp.MustCompile(`\s{2,}`)
	for _, line := range strings.Split(table, "\n") {
		if cells := sep.Split(strings.TrimSpace(line), -1); len(cells) > 1 {
			rows[cells[0]] = cells
		}
	}
	return rows
}

// hasRow says whether a line of the table holds all the cells, in order, separated by
// padding; a cell "*" is any one word.
func hasRow(table string, cells ...string) bool {
	parts := make([]string, len(cells))
	for i, c := range cells {
		parts[i] = regexp.QuoteMeta(c)
		if c == "*" {
			parts[i] = `\S+`
		}
	}
	return regexp.MustCompile(`(?m)^\s*` + strings.Join(parts, `\s+`) + `\s*$`).MatchString(table)
}

const backendSubsets = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend, namespace: default}
spec:
  host: backend.default.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
`

// meshctl proxy-status and proxy-config against a running local mesh: two discovery
// replicas (two meshes, each with its own discovery and pods) merged in one table, per type
// SYNCED; the proxy's tables name its real clusters, listeners, routes, endpoints,
// secrets and bootstrap; a config the proxy rejects shows STALE with the proxy's error.
func TestMeshctlProxyStatusAndConfig(t *testing.T) {
	bin := meshctlBinary(t)
	bins, wasmDir := meshtest.Binaries(t)
	cfg := frontBack()
	cfg["backend-dr.yaml"] = backendSubsets
	m, ctx := startMeshWith(t, bins, wasmDir, cfg, "discovery-a")
	back, err := m.AddPod(ctx, backendPod())
	require.NoError(t, err)
	front, err := m.AddPod(ctx, frontendPod())
	require.NoError(t, err)
	other, octx := startMeshWith(t, bins, wasmDir, frontBack(), "discovery-b")
	_, err = other.AddPod(octx, backendPod(func(s *localmesh.PodSpec) { s.Name = "solo" }))
	require.NoError(t, err)

	addrs := "--discoveryAddress=" + strings.TrimPrefix(m.DiscoveryURL(""), "http://") + "," + other.DiscoveryURL("")
	frontName := front.Spec.Name + ".default"

	// Every proxy of both replicas, each by its replica, synced on the types it uses.
	status := waitOutput(t, "proxy-status", func() (string, bool) {
		status := meshctl(t, ctx, bin, "proxy-status", addrs)
		return status, hasRow(status, frontName, "Kubernetes", "SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT SENT", "discovery-a", "*") &&
			hasRow(status, back.Spec.Name+".default", "Kubernetes", "SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT SENT", "discovery-a", "*") &&
			hasRow(status, "solo.default", "Kubernetes", "SYNCED", "SYNCED", "SYNCED", "SYNCED", "NOT SENT", "discovery-b", "*")
	})
	t.Logf("proxy-status:\n%s", status)
	assert.True(t, hasRow(status, "NAME", "CLUSTER", "CDS", "LDS", "EDS", "RDS", "ECDS", "DISCOVERY", "VERSION"), status)

	var rows []struct {
		Name      string `json:"name"`
		Discovery string `json:"discovery"`
		Status    []struct{ Type, Status string }
	}
	require.NoError(t, json.Unmarshal([]byte(meshctl(t, ctx, bin, "proxy-status", addrs, "-o", "json")), &rows))
	assert.Len(t, rows, 3)

	// One pod: per type the proxy's own config_dump holds the version discovery has acked.
	detail := meshctl(t, ctx, bin, "proxy-status", addrs, frontName)
	t.Logf("proxy-status %s:\n%s", frontName, detail)
	for _, typ := range []string{"CDS", "LDS", "EDS", "RDS"} {
		r := tableRows(detail)[typ]
		require.Len(t, r, 7, detail)
		assert.Equal(t, []string{"SYNCED", "MATCHES ACKED"}, []string{r[1], r[4]}, typ)
		assert.Equal(t, r[3], r[5], "%s: the version the proxy holds is the one acked", typ)
		assert.Regexp(t, `^[1-9]\d* same$`, r[6], "%s: the proxy holds the resources discovery generates for it", typ)
	}

	// Shell completion offers the pods discovery knows.
	completion := meshctl(t, ctx, bin, "__complete", "proxy-config", "clusters", addrs, "")
	assert.Contains(t, completion, frontName+"\n")
	assert.Contains(t, completion, "solo.default\n")

	proxyConfigTables(t, ctx, bin, addrs, front, back)
	nackShowsStale(t, ctx, m, bin, addrs, front)
}

// startMeshWith starts a mesh whose discovery replica is named replica (POD_NAME).
func startMeshWith(t *testing.T, bin, wasmDir string, config map[string]string, replica string) (*localmesh.Mesh, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	m, err := localmesh.Start(ctx, localmesh.Options{BinDir: bin, WasmDir: wasmDir, Config: config, Logf: t.Logf,
		DiscoveryEnv: []string{"POD_NAME=" + replica}})
	if err != nil && strings.Contains(err.Error(), "no envoy on PATH") {
		t.Skip("MESH_PROXY=envoy but there is no envoy on PATH")
	}
	require.NoError(t, err)
	meshtest.CloseAtEnd(t, m.Dir(), m.Close)
	return m, ctx
}

func proxyConfigTables(t *testing.T, ctx context.Context, bin, addrs string, front, back *localmesh.Pod) {
	pc := func(args ...string) string {
		return meshctl(t, ctx, bin, append([]string{"proxy-config"}, append(args, front.Spec.Name, addrs)...)...)
	}
	const backendHost = "backend.default.svc.cluster.local"

	clusters := pc("clusters")
	t.Logf("clusters:\n%s", clusters)
	assert.True(t, hasRow(clusters, "SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"), clusters)
	assert.True(t, hasRow(clusters, backendHost, "9081", "-", "outbound", "EDS", "backend.default"), clusters)
	assert.True(t, hasRow(clusters, backendHost, "9081", "v1", "outbound", "EDS", "backend.default"), clusters)
	assert.True(t, hasRow(clusters, "8080", "-", "inbound", "STATIC"), clusters)
	assert.True(t, hasRow(clusters, "BlackHoleCluster", "-", "-", "-", "STATIC"), clusters)
	inbound := pc("clusters", "--direction", "inbound")
	assert.NotContains(t, inbound, backendHost)
	assert.Contains(t, inbound, "inbound")
	var raw []struct {
		Name string `json:"name"`
	}
	require.NoError(t, json.Unmarshal([]byte(pc("clusters", "--fqdn", "backend", "--subset", "v1", "-o", "json")), &raw))
	require.Len(t, raw, 1)
	assert.Equal(t, "outbound|9081|v1|"+backendHost, raw[0].Name)

	listeners := pc("listeners")
	t.Logf("listeners:\n%s", listeners)
	assert.True(t, hasRow(listeners, "ADDRESSES", "PORT", "MATCH", "DESTINATION"), listeners)
	assert.True(t, hasRow(listeners, front.Localhost, "9081", "ALL", "Route: 9081"), listeners)
	assert.True(t, hasRow(listeners, front.IP, "8080", "Trans: raw_buffer", "Cluster: inbound|8080||"), listeners)
	assert.True(t, hasRow(listeners, front.IP, "15090", "ALL", "Inline Route: /stats/prometheus*"), listeners)

	routes := pc("routes")
	t.Logf("routes:\n%s", routes)
	assert.True(t, hasRow(routes, "NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"), routes)
	assert.Regexp(t, `(?m)^9081\s+`+regexp.QuoteMeta(backendHost+":9081")+`\s+backend.*\s/\*\s*$`, routes)

	endpoints := pc("endpoints")
	t.Logf("endpoints:\n%s", endpoints)
	assert.True(t, hasRow(endpoints, "ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"), endpoints)
	assert.True(t, hasRow(endpoints, back.IP+":8081", "HEALTHY", "OK", "outbound|9081||"+backendHost), endpoints)
	assert.True(t, hasRow(endpoints, back.IP+":8081", "HEALTHY", "OK", "outbound|9081|v1|"+backendHost), endpoints)

	secrets := pc("secrets")
	t.Logf("secrets:\n%s", secrets)
	assert.Regexp(t, `(?m)^default\s+Cert Chain\s+ACTIVE\s+true\s+[0-9a-f]{32}\s+\S+Z\s+\S+Z\s*$`, secrets)
	assert.Regexp(t, `(?m)^ROOTCA\s+CA\s+ACTIVE\s+true\s+`, secrets)

	summary := pc("bootstrap", "-o", "table")
	assert.Regexp(t, `(?m)^Node ID:\s+sidecar~`+regexp.QuoteMeta(front.IP)+`~`+regexp.QuoteMeta(front.Spec.Name)+`\.default~`, summary)
	var boot struct {
		Bootstrap struct {
			Node struct {
				ID string `json:"id"`
			} `json:"node"`
		} `json:"bootstrap"`
	}
	require.NoError(t, json.Unmarshal([]byte(pc("bootstrap")), &boot))
	assert.Contains(t, boot.Bootstrap.Node.ID, front.Spec.Name)

	// --admin instead of a pod; a pod discovery does not know is an error naming it.
	byAdmin := meshctl(t, ctx, bin, "proxy-config", "clusters", "--admin", front.AdminURL(""))
	assert.Equal(t, clusters, byAdmin)
	_, stderr, err := meshctlRun(ctx, bin, "proxy-config", "clusters", "nosuchpod", addrs)
	require.Error(t, err)
	assert.Contains(t, stderr, `no proxy of pod "nosuchpod" is connected`)
}

// nackShowsStale writes an EnvoyFilter whose Wasm module does not exist: the frontend's
// proxy rejects the listeners, and proxy-status shows LDS STALE with its error.
func nackShowsStale(t *testing.T, ctx context.Context, m *localmesh.Mesh, bin, addrs string, front *localmesh.Pod) {
	// The proxy refuses a Wasm filter whose module it cannot open (meshproxy as Envoy).
	wasm := `{"@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {name: broken,
          vm_config: {runtime: envoy.wasm.runtime.v8, code: {local: {filename: /nonexistent/broken.wasm}}}}}`
	require.NoError(t, m.WriteConfig("broken-ef.yaml", `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: unloadable, namespace: default}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match: {context: SIDECAR_INBOUND, listener: {filterChain: {filter: {name: envoy.filters.network.http_connection_manager,
      subFilter: {name: envoy.filters.http.router}}}}}
    patch: {operation: INSERT_BEFORE, value: {name: broken.wasm, typed_config: `+wasm+`}}
  workloadSelector: {labels: {app: frontend}}
`))
	frontName := front.Spec.Name + ".default"
	status := waitOutput(t, "proxy-status shows the NACK", func() (string, bool) {
		status := meshctl(t, ctx, bin, "proxy-status", addrs)
		return status, hasRow(tableLine(status, frontName), frontName, "Kubernetes", "SYNCED", "STALE (NACK)", "SYNCED", "SYNCED", "NOT SENT", "discovery-a", "*")
	})
	t.Logf("proxy-status after the NACK:\n%s", status)
	assert.Regexp(t, `(?m)^  `+regexp.QuoteMeta(frontName)+` LDS version \S+: .*broken\.wasm`, status)

	detail := meshctl(t, ctx, bin, "proxy-status", addrs, frontName)
	r := tableRows(detail)["LDS"]
	require.Len(t, r, 7, detail)
	assert.Equal(t, "STALE (NACK)", r[1])
	assert.NotEqual(t, r[2], r[3], "the version sent is not the one acked")
	assert.Equal(t, "MATCHES ACKED", r[4], "the proxy keeps the version it acked last")
	assert.Contains(t, detail, "broken.wasm")
}

// tableLine is the table's line starting with first.
func tableLine(table, first string) string {
	for _, l := range strings.Split(table, "\n") {
		if strings.HasPrefix(l, first+" ") {
			return l
		}
	}
	return ""
}

// waitOutput runs try until it is satisfied (20s at most) and returns its output; on
// timeout the test fails with the last output.
func waitOutput(t *testing.T, what string, try func() (string, bool)) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, ok := try()
		if ok {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not as expected within 20s; last output:\n%s", what, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
