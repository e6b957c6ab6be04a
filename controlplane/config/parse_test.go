package config

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networking "istio.io/api/networking/v1alpha3"
)

const goodSE = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: reviews
  namespace: shop
  labels: {app: reviews}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: 9080, name: http, protocol: HTTP, targetPort: 8080}
  workloadSelector:
    labels: {app: reviews}
`

func TestParseFileGoodDocuments(t *testing.T) {
	docs := ParseFile("svc.yaml", []byte("# leading comment\n---"+goodSE+"---\n# only a comment\n---\n"+`
apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata: {name: vm-1}
spec: {address: 10.0.0.1, labels: {app: reviews}, ports: {http: 8081}}
`))
	require.Len(t, docs, 2)
	for _, d := range docs {
		require.Nil(t, d.Err)
	}
	se := docs[0].Config
	assert.Equal(t, Key{ServiceEntry, "shop", "reviews"}, se.Key())
	assert.Equal(t, "svc.yaml#2", se.Source)
	spec := se.Spec.(*networking.ServiceEntry)
	assert.Equal(t, networking.ServiceEntry_STATIC, spec.GetResolution())
	assert.Equal(t, uint32(8080), spec.GetPorts()[0].GetTargetPort())
	assert.Equal(t, Key{WorkloadEntry, DefaultNamespace, "vm-1"}, docs[1].Config.Key())
	assert.Equal(t, 4, docs[1].Index)
}

func TestParseFileErrorsNameFileDocumentAndField(t *testing.T) {
	cases := []struct {
		name    string
		doc     string
		field   string
		keyed   bool
		message string
	}{
		{"unknown spec field", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com], ports: [{number: 80, name: http}], colour: red}`, "spec", true, `unknown field "colour"`},
		{"port out of range", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com], ports: [{number: 70000, name: http}]}`, "spec.ports[0].number", true, "out of range"},
		{"duplicate port name", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com], ports: [{number: 80, name: http}, {number: 81, name: http}]}`, "spec.ports[1].name", true, "duplicate"},
		{"bad enum", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com], resolution: MAGIC, ports: [{number: 80, name: http}]}`, "spec", true, "MAGIC"},
		{"wrong apiVersion", `
apiVersion: networking.istio.io/v9
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com]}`, "apiVersion", true, "v9"},
		{"unknown top-level field", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
specs: {}`, "", true, `unknown field "specs"`},
		{"unknown kind", `
apiVersion: networking.istio.io/v1
kind: Frobnicator
metadata: {name: a}
spec: {}`, "kind", true, "Frobnicator"},
		{"missing name", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {namespace: x}
spec: {hosts: [a]}`, "metadata.name", false, "missing"},
		{"broken yaml", "kind: [unclosed", "", false, "invalid YAML"},
		{"static endpoint needs IP", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: a}
spec: {hosts: [a.example.com], resolution: STATIC, ports: [{number: 80, name: http}], endpoints: [{address: db.example.com}]}`, "spec.endpoints[0].address", true, "needs an IP"},
		{"workload entry port", `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a}
spec: {address: 10.0.0.1, ports: {http: 0}}`, "spec.ports.http", true, "out of range"},
		{"destination rule host", `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: a}
spec: {host: "bad host"}`, "spec.host", true, "invalid host"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			docs := ParseFile("bad.yaml", []byte("---\n"+tc.doc))
			require.Len(t, docs, 1)
			d := docs[0]
			require.NotNil(t, d.Err)
			assert.Nil(t, d.Config)
			assert.Equal(t, "bad.yaml", d.Err.File)
			assert.Equal(t, 2, d.Err.Doc)
			assert.Equal(t, tc.field, d.Err.Field)
			assert.Contains(t, d.Err.Error(), tc.message)
			assert.Contains(t, d.Err.Error(), "bad.yaml: document 2")
			assert.Equal(t, tc.keyed, d.Key != nil)
		})
	}
}

func TestIndexForWorkload(t *testing.T) {
	docs := ParseFile("s.yaml", []byte(`
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: all, namespace: shop}
spec: {egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: shop}
spec: {workloadSelector: {labels: {app: reviews}}, egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: root, namespace: istio-system}
spec: {egress: [{hosts: ["*/*"]}]}
`))
	var cs []*Config
	for _, d := range docs {
		require.Nil(t, d.Err)
		cs = append(cs, d.Config)
	}
	ix := NewIndex(cs)
	names := func(cs []*Config) (out []string) {
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return
	}
	assert.Equal(t, []string{"all", "reviews", "root"}, names(ix.ForWorkload(Sidecar, "shop", "istio-system", map[string]string{"app": "reviews"})))
	assert.Equal(t, []string{"all", "root"}, names(ix.ForWorkload(Sidecar, "shop", "istio-system", map[string]string{"app": "ratings"})))
	assert.Equal(t, []string{"root"}, names(ix.ForWorkload(Sidecar, "other", "istio-system", nil)))
	assert.Len(t, ix.List(Sidecar), 3)
}

// A full push re-indexes the configs with the previous index: the kinds that did not change
// keep their lists, the changed kind is indexed anew, and the result is what NewIndex
// makes of the same configs.
func TestReindexSharesTheKindsThatDidNotChange(t *testing.T) {
	parse := func(yaml string) []*Config {
		var cs []*Config
		for _, d := range ParseFile("s.yaml", []byte(yaml)) {
			require.Nil(t, d.Err, "%v", d.Err)
			cs = append(cs, d.Config)
		}
		return cs
	}
	se := func(name, ns string) string {
		return "---\napiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: " + name + ", namespace: " + ns + "}\n" +
			"spec: {hosts: [" + name + "." + ns + ".example], ports: [{number: 80, name: http}]}\n"
	}
	sidecars := parse(`
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: a, namespace: shop}
spec: {egress: [{hosts: ["./*"]}]}
`)
	before := append(parse(se("xa", "shop")+se("ya", "web")+se("za", "web")), sidecars...)
	prev := NewIndex(before)
	after := append(append(slices.Clone(before[:1]), parse(se("new", "shop"))...), before[1:]...)
	SortConfigs(after)
	ix := Reindex(prev, after)
	fresh := NewIndex(after)

	assert.Equal(t, fresh.Len(), ix.Len())
	for _, kind := range []Kind{ServiceEntry, Sidecar} {
		assert.Equal(t, fresh.List(kind), ix.List(kind), kind)
		for _, ns := range []string{"shop", "web", "none"} {
			assert.Equal(t, fresh.Namespace(kind, ns), ix.Namespace(kind, ns), "%s %s", kind, ns)
		}
	}
	assert.Same(t, &prev.List(Sidecar)[0], &ix.List(Sidecar)[0], "an unchanged kind keeps its list")
	assert.NotSame(t, &prev.List(ServiceEntry)[0], &ix.List(ServiceEntry)[0], "a changed kind is indexed anew")
	assert.Equal(t, []string{"new", "xa"}, []string{ix.Namespace(ServiceEntry, "shop")[0].Name, ix.Namespace(ServiceEntry, "shop")[1].Name})
	// A namespace's list is part of its kind's: appending to it must not overwrite the next.
	_ = append(ix.Namespace(ServiceEntry, "shop"), sidecars[0])
	assert.Equal(t, "ya", ix.Namespace(ServiceEntry, "web")[0].Name)
}
