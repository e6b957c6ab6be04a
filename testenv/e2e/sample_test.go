package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/echo"
	"github.com/wasmesh/wasmesh/testenv/loadgen"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// sampleConfig is the sample config directory `make run` uses, file by file.
func sampleConfig(t *testing.T) map[string]string {
	t.Helper()
	cfg := map[string]string{}
	dir := filepath.Join("..", "samples", "bookinfo")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		cfg[e.Name()] = string(b)
	}
	return cfg
}

// What `make run` starts works: the sample config is accepted whole, traffic through the
// bookinfo pods fails nothing, reviews gets its 80/20 split, the telemetry filter reports
// on every hop, and an edit of a sample file changes the running mesh.
func TestSampleMesh(t *testing.T) {
	cfg := sampleConfig(t)
	m, ctx := startMesh(t, cfg)
	var front *localmesh.Pod
	var pods []*localmesh.Pod
	for _, spec := range localmesh.Bookinfo() {
		p, err := m.AddPod(ctx, spec)
		require.NoError(t, err)
		pods = append(pods, p)
		if spec.Labels["app"] == "productpage" {
			front = p
		}
	}

	b, err := getURL(m.DiscoveryURL("/debug/configz"))
	require.NoError(t, err)
	var configz struct {
		Documents []struct{ File, Status, Error string } `json:"documents"`
	}
	require.NoError(t, json.Unmarshal(b, &configz))
	require.NotEmpty(t, configz.Documents)
	for _, d := range configz.Documents {
		assert.Equal(t, "applied", d.Status, "%s: %s", d.File, d.Error)
	}

	reviewsVersion := func(r *http.Response, body []byte) string {
		var a echo.Answer
		if json.Unmarshal(body, &a) != nil || len(a.Upstream) == 0 || a.Upstream[0].Answer == nil {
			return ""
		}
		return a.Upstream[0].Answer.Version
	}
	send := func(n int) *loadgen.Result {
		res, err := loadgen.Run(ctx, loadgen.Config{Requests: n, Concurrency: 8, Classify: reviewsVersion,
			Request: func(int) (*http.Request, error) { return http.NewRequest(http.MethodGet, front.URL("/"), nil) },
			Failed:  func(s int) bool { return s != http.StatusOK }})
		require.NoError(t, err)
		return res
	}
	res := send(1000)
	t.Logf("1000 requests: %s, reviews versions %v", res.String(), res.Classes)
	assert.Zero(t, res.Failed)
	assert.InDelta(t, 0.8, res.Fraction("v1"), 0.05)

	ms, err := front.Metrics(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ms.Sum("istio_requests_total", map[string]string{"reporter": "source",
		"source_workload": "productpage-v1", "destination_service_name": "reviews", "request_method": "GET"}), 1000.0)
	// Every pod's page (telemetry on all, quota on ratings) has clean names, tags as labels.
	for _, p := range pods {
		requireCleanNames(t, ctx, p)
	}

	// Edit the sample: all of reviews to v2. The running mesh follows.
	edited := strings.Replace(strings.Replace(cfg["reviews.yaml"], "weight: 80", "weight: 0", 1), "weight: 20", "weight: 100", 1)
	require.NotEqual(t, cfg["reviews.yaml"], edited)
	begin := time.Now()
	require.NoError(t, m.WriteConfig("reviews.yaml", edited))
	require.Eventually(t, func() bool { return send(20).Fraction("v2") == 1 }, 20*time.Second, 10*time.Millisecond)
	t.Logf("the edit reached the proxies %v after the file was written", time.Since(begin).Round(time.Millisecond))
}
