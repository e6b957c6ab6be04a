package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/kubecluster"
)

// The cluster's objects: namespace shop is clean (a route to a Service whose subset selects
// its running pod), namespace broken routes to an unknown host and has a subset that selects
// none of its Service's pods.
const clusterObjects = `apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: broken}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app, namespace: broken}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec: {selector: {app: reviews}, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: shop, labels: {app: reviews, version: v1}}
spec: {serviceAccountName: app, containers: [{name: app, image: reviews}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v1}}]}]}
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: broken}
spec: {selector: {app: reviews}, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: broken, labels: {app: reviews, version: v1}}
spec: {serviceAccountName: app, containers: [{name: app, image: reviews}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: broken}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: broken}
spec: {hosts: [reviews], http: [{route: [{destination: {host: ratings}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: zero, namespace: broken}
spec: {hosts: [zero], http: [{route: [{destination: {host: reviews}, weight: 0}, {destination: {host: reviews}, weight: 0}]}]}
`

// The fix, given as a file over the cluster: the route goes to reviews, the subset that
// selects nothing is gone, the rejected route has a destination with a weight.
const clusterFix = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: broken}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: broken}
spec: {hosts: [reviews], http: [{route: [{destination: {host: reviews, subset: v1}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: zero, namespace: broken}
spec: {hosts: [zero], http: [{route: [{destination: {host: reviews}}]}]}
`

// analyze --kubernetes reads a real kube-apiserver: the Istio objects as discovery's
// Kubernetes source reads them, the Services and Pods, and runs the checks analyze <dir>
// runs, naming each object "Kind namespace/name"; files given too override the cluster's.
func TestAnalyzeKubernetes(t *testing.T) {
	c := kubecluster.ForTest(t, kubecluster.Options{}, "VirtualService", "DestinationRule", "ServiceEntry", "Sidecar")
	bin, err := kubecluster.BinDir()
	require.NoError(t, err)
	objects := filepath.Join(t.TempDir(), "objects.yaml")
	require.NoError(t, os.WriteFile(objects, []byte(clusterObjects), 0o644))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), "--kubeconfig", c.Kubeconfig, "apply", "-f", objects).CombinedOutput()
	require.NoError(t, err, "%s", out)

	kube := []string{"analyze", "--kubernetes", "--kubeconfig", c.Kubeconfig, "--skip-wasm-fetch"}
	stdout, stderr, err := run(t, "", append(kube, "-n", "shop")...)
	require.NoError(t, err, "%s%s", stdout, stderr)
	assert.Empty(t, stdout)
	assert.Equal(t, "\u2714 No validation issues found when analyzing namespace: shop.\n", stderr)

	stdout, stderr, err = run(t, "", kube...)
	require.NoError(t, err, "%s%s", stdout, stderr)
	assert.Contains(t, stderr, "analyzing namespace: default.", "the context's namespace")

	want := []string{ // by origin, as analyze <dir> sorts
		`Error [IST0173] (DestinationRule broken/reviews) The Subset v2 defined in the DestinationRule does not select any pods. Which may lead to 503 UH (NoHealthyUpstream).`,
		`Error [IST0101] (VirtualService broken/reviews) Referenced host not found: "ratings"`,
		// The API server takes it, discovery's validation does not.
		`Error [IST0106] (VirtualService broken/zero) Schema validation error: spec.http[0].route: the destinations' weights add up to 0; give at least one a positive weight`,
	}
	for _, args := range [][]string{{"-n", "broken"}, {"-A"}, {"-k", "-n", "broken"}} {
		stdout, _, err = run(t, "", append(kube, args...)...)
		assert.Equal(t, exitFoundIssues, exitCode(err), "%v: %v", args, err)
		assert.Equal(t, strings.Join(want, "\n")+"\n", stdout, "%v", args)
	}

	fix := writeConfig(t, "fix.yaml", clusterFix)
	stdout, stderr, err = run(t, "", append(kube, "-n", "broken", fix)...)
	require.NoError(t, err, "%s", stdout)
	assert.Empty(t, stdout, "the files' configs replace the cluster's")
	assert.Contains(t, stderr, "No validation issues found when analyzing namespace: broken:\n  - "+fix+"/fix.yaml")

	stdout, _, err = run(t, "", append(kube, "--context", "local", "-n", "broken")...)
	assert.Equal(t, exitFoundIssues, exitCode(err), "%v", err)
	assert.Equal(t, strings.Join(want, "\n")+"\n", stdout, "the kubeconfig's context named")

	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"analyze", "--kubernetes", "--kubeconfig", missing}, missing},
		{append(kube, "--context", "nowhere"), `context "nowhere"`},
		{append(kube, "-n", "nowhere"), `namespace "nowhere" not found`},
	} {
		_, _, err = run(t, "", c.args...)
		require.Error(t, err, "%v", c.args)
		assert.Contains(t, err.Error(), c.want)
	}
}
