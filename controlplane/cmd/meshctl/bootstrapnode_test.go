package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --proxy and --workload take a proxy's bootstrap: Envoy's own JSON or the config_dump
// section `proxy-config bootstrap -o json` prints; anything else is left to the Pod parser.
func TestBootstrapNode(t *testing.T) {
	const node = `{"id": "sidecar~10.0.0.5~web-1.shop~shop.svc.cluster.local",
		"metadata": {"NAMESPACE": "shop", "LABELS": {"app": "web"}, "INTERCEPTION_MODE": "NONE"}, "userAgentName": "envoy"}`
	for name, doc := range map[string]string{
		"bootstrap":   `{"node": ` + node + `, "admin": {}}`,
		"config_dump": `{"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump", "bootstrap": {"node": ` + node + `}}`,
	} {
		n, ok, err := bootstrapNode(name, []byte(doc))
		require.True(t, ok, name)
		require.NoError(t, err, name)
		assert.Equal(t, "sidecar~10.0.0.5~web-1.shop~shop.svc.cluster.local", n.GetId(), name)
		assert.Equal(t, "shop", n.GetMetadata().GetFields()["NAMESPACE"].GetStringValue(), name)
		assert.Equal(t, "web", n.GetMetadata().GetFields()["LABELS"].GetStructValue().GetFields()["app"].GetStringValue(), name)
	}

	_, ok, _ := bootstrapNode("pod.yaml", []byte("apiVersion: v1\nkind: Pod\n"))
	assert.False(t, ok, "a Pod's YAML is not a bootstrap")
	_, ok, _ = bootstrapNode("other.json", []byte(`{"kind": "Pod"}`))
	assert.False(t, ok, "JSON without a node is not a bootstrap")

	_, ok, err := bootstrapNode("noid.json", []byte(`{"node": {"cluster": "x"}}`))
	assert.True(t, ok)
	assert.ErrorContains(t, err, "no id")
	_, ok, err = bootstrapNode("bad.json", []byte(`{"node": {"id": 5}}`))
	assert.True(t, ok)
	assert.ErrorContains(t, err, "bad.json")
}
