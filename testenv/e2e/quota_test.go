package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func quotaPlugin(shadow bool) string {
	s := "false"
	if shadow {
		s = "true"
	}
	return `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: reviews-quota, namespace: default}
spec:
  selector: {matchLabels: {app: reviews}}
  url: file://{{.WasmDir}}/quota.wasm
  phase: AUTHZ
  failStrategy: FAIL_CLOSE
  pluginConfig:
    shadow: ` + s + `
    descriptors:
    - name: per_user
      entries: [{key: user, source: header, header: x-user}]
      token_bucket: {max_tokens: 10, tokens_per_fill: 10, fill_interval: 1h}
`
}

// 3. Quota: requests over the configured limit get 429s with the x-ratelimit-* headers;
// in shadow mode everything passes and the denials are counted.
func TestQuota(t *testing.T) {
	m, ctx, client := reviewsMesh(t)
	send := func(user string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, reviewsURL, nil)
		req.Header.Set("x-user", user)
		resp, err := client.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}

	// The quota is local to each proxy (Envoy's local rate limit, Istio's memquota): send
	// everything to the one v1 pod so its buckets are the ones counted.
	require.NoError(t, m.WriteConfig("reviews-vs.yaml", virtualService(`  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
`)))
	eventually(t, "only v1 answers", func() bool { return only(t, client, "v1") })
	require.NoError(t, m.WriteConfig("quota.yaml", quotaPlugin(false)))
	// The plugin applies once a user is refused; a fresh user then shows the exact limit.
	eventually(t, "the quota applies", func() bool { return send("probe").StatusCode == 429 })
	var statuses []int
	var last *http.Response
	for i := 0; i < 12; i++ {
		last = send("alice")
		statuses = append(statuses, last.StatusCode)
	}
	assert.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429}, statuses)
	assert.Equal(t, "10", last.Header.Get("x-ratelimit-limit"))
	assert.Equal(t, "0", last.Header.Get("x-ratelimit-remaining"))
	assert.NotEmpty(t, last.Header.Get("retry-after"))

	require.NoError(t, m.WriteConfig("quota.yaml", quotaPlugin(true)))
	eventually(t, "shadow mode applies", func() bool {
		for i := 0; i < 12; i++ {
			if send("shadow-probe").StatusCode != 200 {
				return false
			}
		}
		return true
	})
	for i := 0; i < 15; i++ {
		assert.Equal(t, 200, send("bob").StatusCode, "shadow mode never refuses")
	}
	var shadowDenied float64
	require.Eventually(t, func() bool {
		shadowDenied = 0
		for _, p := range m.Pods() {
			if !strings.HasPrefix(p.Spec.Name, "reviews") {
				continue
			}
			ms, err := p.Metrics(ctx)
			if err != nil {
				return false
			}
			shadowDenied += ms.Sum("wasmesh_quota_requests_total", map[string]string{"decision": "shadow_denied"})
		}
		return shadowDenied >= 5
	}, 10*time.Second, 100*time.Millisecond, "bob's five requests over the limit are counted as shadow_denied")

	// The filter's counters have clean names, their tags as labels: the fail-open counter,
	// defined at zero, carries its reason.
	for _, p := range m.Pods() {
		if !strings.HasPrefix(p.Spec.Name, "reviews") {
			continue
		}
		ms := requireCleanNames(t, ctx, p)
		for _, reason := range []string{"cas_exhausted", "store_error"} {
			assert.Len(t, ms.Series("wasmesh_quota_fail_open_total", map[string]string{"descriptor": "per_user", "reason": reason}), 1,
				"%s: %v", p.Spec.Name, ms.Series("wasmesh_quota_fail_open_total", nil))
		}
	}
}
