package discovery_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
)

// A workload joining a subset reaches the proxies watching the subset's cluster in an
// endpoints-only push, and a DestinationRule change gives them the new subset clusters.
func TestSubsetEndpointsFollowWorkloadsAndRules(t *testing.T) {
	e := start(t, map[string]string{"services.yaml": services, "dr.yaml": `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend, namespace: demo}
spec:
  host: backend.demo.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
`}, nil)
	v1, v2 := "outbound|9081|v1|backend.demo.svc.cluster.local", "outbound|9081|v2|backend.demo.svc.cluster.local"
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.EndpointType, v1, v2, backendCluster))

	be := node(t, "backend-1", "backend", "127.10.0.2", "127.20.0.2")
	be.Metadata.Fields["LABELS"].GetStructValue().Fields["version"] = structpb.NewStringValue("v2")
	e.connect(adsc.Config{Node: be})
	wait(t, fe, func(c *adsc.Client) bool {
		return len(endpointsOf(c, v2)) == 1 && len(endpointsOf(c, backendCluster)) == 1
	})
	assert.Empty(t, endpointsOf(fe, v1), "the v2 workload is not in v1")
	last := fe.Responses()[len(fe.Responses())-1]
	assert.Equal(t, adsc.EndpointType, last.TypeURL, "a joining workload is an endpoints-only push")

	e.write("dr.yaml", `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend, namespace: demo}
spec:
  host: backend.demo.svc.cluster.local
  subsets: [{name: all, labels: {app: backend}}]
`)
	all := "outbound|9081|all|backend.demo.svc.cluster.local"
	wait(t, fe, func(c *adsc.Client) bool { return len(endpointsOf(c, all)) == 1 && !c.Has(adsc.ClusterType, v2) })
}
