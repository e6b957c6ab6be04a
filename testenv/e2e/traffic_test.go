package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/loadgen"
	"github.com/wasmesh/wasmesh/testenv/localmesh"
	"github.com/wasmesh/wasmesh/testenv/localmesh/meshtest"
)

const reviewsURL = "http://reviews.default.svc.cluster.local:9080/"

// reviewsMesh is a client pod and reviews v1, v2 and v3 behind one service with a subset
// per version; v3 fails one request in three.
func reviewsMesh(t *testing.T) (*localmesh.Mesh, context.Context, *localmesh.Pod) {
	t.Helper()
	m, ctx := startMesh(t, map[string]string{
		"services.yaml": meshtest.ServiceEntry("reviews", 9080, 8080) + "---\n" + meshtest.ServiceEntry("client", 9090, 8090),
		"reviews-dr.yaml": `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
`,
	})
	for _, v := range []string{"v1", "v2", "v3"} {
		spec := localmesh.PodSpec{Labels: map[string]string{"app": "reviews", "version": v}}
		if v == "v3" {
			spec.FailEvery = 3
		}
		_, err := m.AddPod(ctx, spec)
		require.NoError(t, err)
	}
	client, err := m.AddPod(ctx, localmesh.PodSpec{Labels: map[string]string{"app": "client"}, Port: 8090})
	require.NoError(t, err)
	return m, ctx, client
}

func virtualService(http string) string {
	return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
` + http
}

// call sends one request through the client pod's sidecar.
func call(t *testing.T, client *localmesh.Pod, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, reviewsURL, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Client().Do(req)
	if err != nil {
		return 0, ""
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("x-echo-version")
}

// eventually waits until a probe through the client pod sees the new config.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 50*time.Millisecond, "the configuration never took effect: %s", what)
}

// only reports whether 20 requests in a row are answered by version.
func only(t *testing.T, client *localmesh.Pod, version string, headers ...string) bool {
	for i := 0; i < 20; i++ {
		if s, v := call(t, client, headers...); s != 200 || v != version {
			return false
		}
	}
	return true
}

// load sends n requests through the client pod's sidecar, 16 at a time, and counts versions
// and statuses.
func load(t *testing.T, ctx context.Context, client *localmesh.Pod, n int, headers ...string) *loadgen.Result {
	t.Helper()
	return loadWith(t, ctx, client, n, 16, headers...)
}

// loadWith is load with a given concurrency.
func loadWith(t *testing.T, ctx context.Context, client *localmesh.Pod, n, concurrency int, headers ...string) *loadgen.Result {
	t.Helper()
	res, err := loadgen.Run(ctx, loadgen.Config{Requests: n, Concurrency: concurrency, Client: client.Client(),
		Request: func(int) (*http.Request, error) {
			req, err := http.NewRequest(http.MethodGet, reviewsURL, nil)
			for i := 0; i+1 < len(headers); i += 2 {
				req.Header.Set(headers[i], headers[i+1])
			}
			return req, err
		},
		Classify: func(r *http.Response, _ []byte) string { return r.Header.Get("x-echo-version") },
		Failed:   func(status int) bool { return status != http.StatusOK },
	})
	require.NoError(t, err)
	t.Logf("%d requests: %s, versions %v", n, res.String(), res.Classes)
	return res
}

// 1. Routing: weights, header matches, fault injection, retries and timeouts do what the
// VirtualService says, measured over real traffic.
func TestRouting(t *testing.T) {
	m, ctx, client := reviewsMesh(t)

	t.Run("80/20 weight split within 5%", func(t *testing.T) {
		require.NoError(t, m.WriteConfig("reviews-vs.yaml", virtualService(`  - route:
    - {destination: {host: reviews.default.svc.cluster.local, subset: v1}, weight: 80}
    - {destination: {host: reviews.default.svc.cluster.local, subset: v2}, weight: 20}
`)))
		// In effect once v3, which the split leaves out, stops answering.
		eventually(t, "the split applies", func() bool { return load(t, ctx, client, 100).Classes["v3"] == 0 })
		res := load(t, ctx, client, 2000)
		assert.Zero(t, res.Failed)
		assert.InDelta(t, 0.80, res.Fraction("v1"), 0.05)
		assert.InDelta(t, 0.20, res.Fraction("v2"), 0.05)
	})

	t.Run("header match", func(t *testing.T) {
		require.NoError(t, m.WriteConfig("reviews-vs.yaml", virtualService(`  - match: [{headers: {x-user: {exact: jason}}}]
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
`)))
		eventually(t, "jason reaches v2", func() bool { return only(t, client, "v2", "x-user", "jason") })
		jason := load(t, ctx, client, 200, "x-user", "jason")
		assert.Equal(t, 1.0, jason.Fraction("v2"))
		others := load(t, ctx, client, 200, "x-user", "ann")
		assert.Equal(t, 1.0, others.Fraction("v1"))
	})

	// v3 fails one request in three (a counter in the application): one client at a time,
	// a failed request's retry is the next request and succeeds. Retries go to the same pod
	// (the subset has one), as Envoy's previous_hosts predicate allows when no other host is left.
	t.Run("retries hide an upstream that fails one request in three", func(t *testing.T) {
		route := func(retries string) string {
			return virtualService(`  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v3}}]
    retries: ` + retries + "\n")
		}
		require.NoError(t, m.WriteConfig("reviews-vs.yaml", route(`{attempts: 0}`)))
		eventually(t, "only v3 answers, without retries", func() bool {
			res := loadWith(t, ctx, client, 30, 1)
			return res.Fraction("v3") == 1 && res.Failed == 10
		})
		without := loadWith(t, ctx, client, 300, 1)
		assert.Equal(t, 100, without.Failed, "without retries one request in three fails")

		require.NoError(t, m.WriteConfig("reviews-vs.yaml", route(`{attempts: 2, perTryTimeout: 2s, retryOn: "5xx"}`)))
		eventually(t, "retries configured", func() bool { return loadWith(t, ctx, client, 30, 1).Failed == 0 })
		with := loadWith(t, ctx, client, 300, 1)
		assert.Zero(t, with.Failed)
		assert.Equal(t, 300, with.Classes["v3"])
	})

	t.Run("fault abort at 50%", func(t *testing.T) {
		require.NoError(t, m.WriteConfig("reviews-vs.yaml", virtualService(`  - fault: {abort: {httpStatus: 418, percentage: {value: 50}}}
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
`)))
		eventually(t, "aborts appear", func() bool { s, _ := call(t, client); return s == 418 })
		// 4000 requests: the abort share's standard deviation is 0.8%, so 5% is over 6 of
		// them (at 1000 it was 3, and a correct run failed about once in 600).
		const n = 4000
		res, err := loadgen.Run(ctx, loadgen.Config{Requests: n, Concurrency: 16, Client: client.Client(),
			Request: func(int) (*http.Request, error) { return http.NewRequest(http.MethodGet, reviewsURL, nil) }})
		require.NoError(t, err)
		assert.InDelta(t, 0.5, float64(res.Status[418])/n, 0.05, "%v", res.Status)
		assert.Equal(t, n, res.Status[418]+res.Status[200], "%v", res.Status)
	})

	t.Run("route timeout cuts a slow upstream", func(t *testing.T) {
		require.NoError(t, m.WriteConfig("reviews-vs.yaml", virtualService(`  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v1}}]
    timeout: 300ms
    retries: {attempts: 0}
`)))
		slow := func() (int, time.Duration) {
			req, _ := http.NewRequest(http.MethodGet, "http://reviews.default.svc.cluster.local:9080/delay/3s", nil)
			begin := time.Now()
			resp, err := client.Client().Do(req)
			if err != nil {
				return 0, time.Since(begin)
			}
			resp.Body.Close()
			return resp.StatusCode, time.Since(begin)
		}
		eventually(t, "the timeout applies", func() bool { s, _ := slow(); return s == http.StatusGatewayTimeout })
		s, took := slow()
		assert.Equal(t, http.StatusGatewayTimeout, s)
		assert.Less(t, took, 2*time.Second, fmt.Sprintf("answered after %v: the 3 s upstream was not cut", took))
	})
}
