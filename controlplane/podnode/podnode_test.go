package podnode_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/podnode"
)

const pod = `apiVersion: v1
kind: Pod
metadata:
  name: reviews-v1-7d9f8-abcde
  generateName: reviews-v1-7d9f8-
  namespace: bookinfo
  labels: {app: reviews, version: v1, pod-template-hash: 7d9f8}
  annotations: {sidecar.istio.io/interceptionMode: NONE}
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: reviews-v1-7d9f8, uid: u, controller: true}
spec:
  nodeName: node-a
  serviceAccountName: bookinfo-reviews
  containers:
  - name: reviews
    image: reviews
    ports: [{name: http, containerPort: 9080}]
status:
  podIP: 10.4.0.7
  podIPs: [{ip: 10.4.0.7}, {ip: "fd00::7"}]
`

// The node reads back (model.ParseNode, discovery's reader) as the pod's sidecar: its id,
// namespace, labels (with those injection adds), service account, addresses, container
// ports, interception mode from the pod's annotation, the workload of its Deployment and
// the template's ISTIO_META_* (the node name through the downward API);
// it is registrable as a workload.
func TestNodeOfPod(t *testing.T) {
	p, err := podnode.ParsePod("pod.yaml", []byte(pod))
	require.NoError(t, err)
	node, err := podnode.Node(inject.DefaultConfig(), mesh.Default(), p)
	require.NoError(t, err)
	assert.Equal(t, "sidecar~10.4.0.7~reviews-v1-7d9f8-abcde.bookinfo~bookinfo.svc.cluster.local", node.GetId())
	assert.Equal(t, "reviews.bookinfo", node.GetCluster())

	proxy, err := model.ParseNode(node)
	require.NoError(t, err)
	assert.Equal(t, "bookinfo", proxy.Namespace)
	assert.Equal(t, "bookinfo-reviews", proxy.ServiceAccount)
	assert.Equal(t, []string{"10.4.0.7", "fd00::7"}, proxy.IPAddresses)
	assert.Equal(t, model.InterceptionNone, proxy.InterceptionMode)
	assert.Equal(t, "v1", proxy.Labels["version"])
	assert.Equal(t, "istio", proxy.Labels["security.istio.io/tlsMode"], "a label injection adds")
	assert.Equal(t, []model.PodPort{{Name: "http", ContainerPort: 9080, Protocol: "TCP"}}, proxy.PodPorts)
	assert.True(t, proxy.HealthChecked, "the agent reports health")
	md := node.GetMetadata().GetFields()
	assert.Equal(t, "reviews-v1", md["WORKLOAD_NAME"].GetStringValue())
	assert.Equal(t, "node-a", md["NODE_NAME"].GetStringValue(), "ISTIO_META_NODE_NAME, from the downward API")
	assert.Equal(t, "NONE", md["ANNOTATIONS"].GetStructValue().GetFields()["sidecar.istio.io/interceptionMode"].GetStringValue())
	assert.NotNil(t, md["PROXY_CONFIG"].GetStructValue(), "the effective ProxyConfig, an object")
	w, ok := proxy.Workload()
	require.True(t, ok)
	assert.Equal(t, map[string]uint32{"http": 9080}, w.Ports)
}

// A pod that opts out of injection has no sidecar to translate for.
func TestNodeOfPodWithoutSidecar(t *testing.T) {
	p, err := podnode.ParsePod("pod.yaml", []byte(pod))
	require.NoError(t, err)
	p.Annotations["sidecar.istio.io/inject"] = "false"
	_, err = podnode.Node(inject.DefaultConfig(), mesh.Default(), p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gets no sidecar")
}
