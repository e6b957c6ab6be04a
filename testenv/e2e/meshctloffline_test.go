package e2e

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The offline verbs against the running sample mesh: `meshctl analyze` of its config
// directory finds nothing, then names the field of a file written broken (exit code 79, as
// istioctl analyze); `meshctl x translate` of the same directory, for a running proxy's
// bootstrap (`meshctl proxy-config bootstrap -o json`: its node and metadata), prints what
// discovery sends that proxy: the same clusters, listeners and routes, resource for
// resource.
func TestMeshctlAnalyzeAndTranslateAgainstTheRunningMesh(t *testing.T) {
	bin := meshctlBinary(t)
	m, ctx := startMesh(t, sampleConfig(t))
	front := addBookinfo(t, ctx, m)

	out, stderr, err := meshctlRun(ctx, bin, "analyze", m.ConfigDir())
	require.NoError(t, err, "analyze of the sample: %s%s", out, stderr)
	assert.Contains(t, out+stderr, "No validation issues found")

	var status []struct {
		Proxy string `json:"proxy"`
		Name  string `json:"name"`
	}
	b, err := getURL(m.DiscoveryURL("/debug/syncz"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &status))
	var nodeID string
	for _, s := range status {
		if s.Name == front.Spec.Name {
			nodeID = s.Proxy
		}
	}
	require.NotEmpty(t, nodeID, "the front end's proxy is connected")
	b, err = getURL(m.DiscoveryURL("/debug/config_dump?proxyID=" + url.QueryEscape(nodeID)))
	require.NoError(t, err)
	type resources struct {
		CDS []map[string]any `json:"cds"`
		LDS []map[string]any `json:"lds"`
		RDS []map[string]any `json:"rds"`
	}
	var live, offline resources
	require.NoError(t, json.Unmarshal(b, &live))
	addrs := "--discoveryAddress=" + m.DiscoveryURL("")
	// Every pod's bootstrap: the front end's is the proxy, the others are the workloads
	// connected beside it (endpoints, and the service accounts in its clusters' SANs).
	args := []string{"x", "translate", m.ConfigDir()}
	dir := t.TempDir()
	for _, p := range m.Pods() {
		file := filepath.Join(dir, p.Spec.Name+".json")
		require.NoError(t, os.WriteFile(file, []byte(meshctl(t, ctx, bin, "proxy-config", "bootstrap", p.Spec.Name, addrs, "-o", "json")), 0o644))
		flag := "--workload"
		if p == front {
			flag = "--proxy"
		}
		args = append(args, flag, file)
	}
	tr := meshctl(t, ctx, bin, args...)
	require.NoError(t, json.Unmarshal([]byte(tr), &offline))

	for _, list := range [][]map[string]any{offline.CDS, offline.LDS, offline.RDS} {
		for _, r := range list {
			delete(r, "@type") // translate names each resource's type; the dump's lists are typed
		}
	}
	require.NotEmpty(t, live.CDS)
	assert.Equal(t, live.CDS, offline.CDS, "translate's clusters are what discovery sends the running proxy")
	assert.Equal(t, live.LDS, offline.LDS, "translate's listeners are what discovery sends the running proxy")
	assert.Equal(t, live.RDS, offline.RDS, "translate's routes are what discovery sends the running proxy")
	t.Logf("%s: %d clusters, %d listeners, %d routes, the same offline", front.Spec.Name, len(live.CDS), len(live.LDS), len(live.RDS))

	require.NoError(t, m.WriteConfig("broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\n"+
		"metadata: {name: broken, namespace: default}\nspec: {hosts: [reviews], http: [{route: [{destination: {host: reviews}, weight: -5}]}]}\n"))
	out, stderr, err = meshctlRun(ctx, bin, "analyze", m.ConfigDir())
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "analyze of a broken file fails: %v", err)
	assert.Equal(t, 79, exit.ExitCode(), "istioctl analyze's exit code for issues found")
	assert.Contains(t, out+stderr, "broken.yaml")
	assert.Contains(t, out+stderr, "weight")
}
