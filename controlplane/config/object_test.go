package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// objectOf reads a YAML document as an API server would serve it.
func objectOf(t *testing.T, doc string) Object {
	t.Helper()
	var o struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name        string            `json:"name"`
			Namespace   string            `json:"namespace"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec map[string]any `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(doc), &o))
	spec, err := yaml.Marshal(o.Spec)
	require.NoError(t, err)
	js, err := yaml.YAMLToJSON(spec)
	require.NoError(t, err)
	return Object{Kind: o.Kind, APIVersion: o.APIVersion, Name: o.Metadata.Name, Namespace: o.Metadata.Namespace,
		Labels: o.Metadata.Labels, Annotations: o.Metadata.Annotations, Spec: js}
}

// An object and the same document in a file make the same config.
func TestFromObjectIsParseFile(t *testing.T) {
	docs := ParseFile("svc.yaml", []byte(goodSE))
	require.Len(t, docs, 1)
	require.Nil(t, docs[0].Err)
	c, err := FromObject("kubernetes: ServiceEntry shop/reviews", objectOf(t, goodSE))
	require.Nil(t, err)
	assert.True(t, c.Equal(docs[0].Config))
	assert.True(t, proto.Equal(c.Spec, docs[0].Config.Spec))
	assert.Equal(t, "kubernetes: ServiceEntry shop/reviews", c.Source)
	assert.Equal(t, "networking.istio.io", c.Group)
	assert.Equal(t, "v1", c.Version)
}

// A rejected object names itself (the source) and the field, as a rejected document does,
// and the error is the one ParseFile gives for the same document.
func TestFromObjectErrorNamesObjectAndField(t *testing.T) {
	const vs = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  tcp:
  - route:
    - destination: {host: reviews}
`
	docs := ParseFile("vs.yaml", []byte(vs))
	require.NotNil(t, docs[0].Err)
	_, err := FromObject("kubernetes: VirtualService shop/reviews", objectOf(t, vs))
	require.NotNil(t, err)
	assert.Equal(t, "spec.tcp", err.Field)
	assert.Equal(t, docs[0].Err.Field, err.Field)
	assert.Equal(t, docs[0].Err.Err.Error(), err.Err.Error())
	assert.Equal(t, &Key{VirtualService, "shop", "reviews"}, err.Key)
	assert.Equal(t, "kubernetes: VirtualService shop/reviews: spec.tcp: "+err.Err.Error(), err.Error())
	assert.Equal(t, "vs.yaml: document 1 (VirtualService shop/reviews): spec.tcp: "+err.Err.Error(), docs[0].Err.Error())

	bad := objectOf(t, vs)
	bad.APIVersion = "networking.istio.io/v2"
	_, err = FromObject("kubernetes: VirtualService shop/reviews", bad)
	require.NotNil(t, err)
	assert.Equal(t, "apiVersion", err.Field)

	bad = objectOf(t, vs)
	bad.Spec = []byte(`{"hosts":["reviews"],"bogus":1}`)
	_, err = FromObject("kubernetes: VirtualService shop/reviews", bad)
	require.NotNil(t, err)
	assert.Equal(t, "spec", err.Field)
	assert.Contains(t, err.Error(), "bogus")
}
