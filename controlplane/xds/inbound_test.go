package xds_test

import (
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/mesh"
	"github.com/wasmesh/wasmesh/controlplane/model"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// A Kubernetes Service's named targetPort is resolved through the pod's own ports: the
// proxy's inbound listener is on the container port of that name, whatever the service
// port is named.
func TestNamedTargetPortIsThePodsContainerPort(t *testing.T) {
	reg := registry.NewPublished("kubernetes")
	reg.SetServices([]*model.Service{{Hostname: "web.shop.svc.cluster.local", Namespace: "shop", Name: "web",
		Ports: []model.Port{
			{Name: "http", Port: 80, TargetPortName: "web-http", Protocol: model.HTTP},
			{Name: "metrics", Port: 9090, TargetPort: 9091, Protocol: model.HTTP},
		},
		WorkloadSelector: map[string]string{"app": "web"}}}, nil)
	snap := xds.NewSnapshot(push.Build("v1", mesh.Default(), config.NewIndex(nil), registry.NewAggregate(reg)))
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "web"},
		"POD_PORTS": `[{"name":"web-http","containerPort":8081,"protocol":"TCP"},{"name":"http","containerPort":7000,"protocol":"TCP"}]`})
	require.NoError(t, err)
	p, err := model.ParseNode(&core.Node{Id: "sidecar~10.2.0.9~web-1.shop~shop.svc.cluster.local", Metadata: md})
	require.NoError(t, err)
	var ports []uint32
	for _, in := range xds.NewView(snap, p).Inbounds {
		ports = append(ports, in.Port)
	}
	assert.Equal(t, []uint32{8081, 9091}, ports, "the named container port, not the one named like the service port (7000)")
}
