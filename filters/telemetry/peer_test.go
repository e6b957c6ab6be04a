package main

import (
	"encoding/base64"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
	"github.com/wasmesh/wasmesh/wasm/protowire"
)

func TestEncodePeerMetadataWireFormat(t *testing.T) {
	// Worked by hand from the protobuf encoding of google.protobuf.Struct:
	// fields{key:"LABELS" value{struct_value{fields{key:"app" value{string_value:"r"}}}}}
	// fields{key:"NAME" value{string_value:"a"}}
	const want = "0a18" + "0a064c4142454c53" + "120e" + "2a0c" + "0a0a" + "0a03617070" + "1203" + "1a0172" +
		"0a0b" + "0a044e414d45" + "1203" + "1a0161"
	got, err := base64.StdEncoding.DecodeString(encodePeerMetadata(nodeIdentity{Name: "a", Labels: map[string]string{"app": "r"}}))
	require.NoError(t, err)
	assert.Equal(t, want, hex.EncodeToString(got))
}

func TestPeerMetadataRoundTrip(t *testing.T) {
	id := nodeIdentity{
		Name: "reviews-v3-55545c459b-fmf5f", Namespace: "default", WorkloadName: "reviews-v3",
		Owner: "kubernetes://apis/apps/v1/namespaces/default/deployments/reviews-v3", ClusterID: "Kubernetes",
		MeshID: "cluster.local", ServiceAccount: "bookinfo-reviews",
		Labels: map[string]string{"app": "reviews", "version": "v3", "security.istio.io/tlsMode": "istio"},
	}
	header := encodePeerMetadata(id)
	assert.Equal(t, header, encodePeerMetadata(id), "the encoding is deterministic")
	got, err := decodePeerMetadata(header)
	require.NoError(t, err)
	assert.Equal(t, id, got)

	unpadded := base64.RawStdEncoding.EncodeToString(mustDecodeBase64(t, header))
	got, err = decodePeerMetadata(unpadded)
	require.NoError(t, err)
	assert.Equal(t, id, got)
}

func mustDecodeBase64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	return b
}

// TestDecodeSkipsWhatItDoesNotUse decodes a Struct with value kinds Istio sends that the
// filter ignores (numbers, bools, lists, nested structs under other keys), and a field a Value
// it reads does not have, of a wire type Struct does not use (fixed32).
func TestDecodeSkipsWhatItDoesNotUse(t *testing.T) {
	var b []byte
	b = appendStructEntry(b, "ISTIO_VERSION", appendStringValue(nil, "1.20.0"))
	num := append(protowire.AppendVarint(nil, 2<<3|protowire.Fixed64), 0, 0, 0, 0, 0, 0, 0xf0, 0x3f) // number_value 1.0
	b = appendStructEntry(b, "SOME_NUMBER", num)
	b = appendStructEntry(b, "SOME_BOOL", protowire.AppendVarint(protowire.AppendVarint(nil, 4<<3|protowire.Varint), 1))
	list := protowire.AppendBytes(nil, 6, protowire.AppendBytes(nil, 1, appendStringValue(nil, "x")))
	b = appendStructEntry(b, "APP_CONTAINERS", list)
	b = appendStructEntry(b, "PLATFORM_METADATA", protowire.AppendBytes(nil, 5, nil))
	unknown := append(protowire.AppendVarint(nil, 9<<3|protowire.Fixed32), 1, 2, 3, 4) // a field Value does not have
	b = appendStructEntry(b, "WORKLOAD_NAME", appendStringValue(unknown, "ratings-v1"))
	b = appendStructEntry(b, "NAMESPACE", num) // wrong kind: ignored, not an error
	labels := appendStructEntry(nil, "app", appendStringValue(nil, "ratings"))
	labels = appendStructEntry(labels, "n", num)
	b = appendStructEntry(b, "LABELS", protowire.AppendBytes(nil, 5, labels))

	got, err := decodePeerMetadata(base64.StdEncoding.EncodeToString(b))
	require.NoError(t, err)
	assert.Equal(t, nodeIdentity{WorkloadName: "ratings-v1", Labels: map[string]string{"app": "ratings"}}, got)
}

func TestDecodeRejectsMalformed(t *testing.T) {
	valid := mustDecodeBase64(t, encodePeerMetadata(nodeIdentity{WorkloadName: "w", Labels: map[string]string{"a": "b"}}))
	for name, input := range map[string]string{
		"not base64":     "%%%",
		"truncated":      base64.StdEncoding.EncodeToString(valid[:len(valid)-3]),
		"bad length":     base64.StdEncoding.EncodeToString([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}),
		"group wire":     base64.StdEncoding.EncodeToString([]byte{0x0b}),
		"field zero":     base64.StdEncoding.EncodeToString([]byte{0x02, 0x00}),
		"endless varint": base64.StdEncoding.EncodeToString([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}),
		"too long":       base64.StdEncoding.EncodeToString(make([]byte, maxPeerHeaderLen)),
	} {
		_, err := decodePeerMetadata(input)
		assert.Error(t, err, name)
	}
}

func FuzzDecodePeerMetadata(f *testing.F) {
	f.Add(encodePeerMetadata(nodeIdentity{WorkloadName: "w", Namespace: "ns", Labels: map[string]string{"app": "a"}}))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := decodePeerMetadata(s)
		if err == nil {
			// Whatever decodes re-encodes to something that decodes to the same identity.
			again, err := decodePeerMetadata(encodePeerMetadata(id))
			require.NoError(t, err)
			if len(id.Labels) == 0 {
				id.Labels = nil
			}
			assert.Equal(t, id, again)
		}
	})
}

func TestWorkloadDerivedLabels(t *testing.T) {
	for _, tc := range []struct {
		name                       string
		id                         nodeIdentity
		app, version, canonSvc, rv string
	}{
		{"istio labels", nodeIdentity{WorkloadName: "w", Labels: map[string]string{
			"app": "a", "version": "v1", labelCanonicalName: "cs", labelCanonicalRevision: "cr"}}, "a", "v1", "cs", "cr"},
		{"kubernetes labels", nodeIdentity{WorkloadName: "w", Labels: map[string]string{
			labelK8sName: "kn", labelK8sVersion: "kv"}}, "kn", "kv", "kn", "kv"},
		{"app and version only", nodeIdentity{WorkloadName: "w", Labels: map[string]string{"app": "a", "version": "v2"}},
			"a", "v2", "a", "v2"},
		{"no labels", nodeIdentity{WorkloadName: "w"}, "", "", "w", "latest"},
	} {
		w := newWorkload(tc.id)
		assert.Equal(t, []string{tc.app, tc.version, tc.canonSvc, tc.rv},
			[]string{w.app, w.version, w.canonicalService, w.canonicalRevision}, tc.name)
	}
}

func TestPeerCacheIsBounded(t *testing.T) {
	c := newPeerCache(3)
	for i := 0; i < 10; i++ {
		w, err := c.get(encodePeerMetadata(nodeIdentity{WorkloadName: string(rune('a' + i))}))
		require.NoError(t, err)
		require.Equal(t, string(rune('a'+i)), w.id.WorkloadName)
		assert.LessOrEqual(t, c.m.Len(), 3)
	}
	w, err := c.get("garbage!")
	assert.Nil(t, w)
	assert.Error(t, err)
	w, err = c.get("garbage!")
	assert.Nil(t, w, "a bad value is remembered as bad")
	assert.NoError(t, err)

	off := newPeerCache(-1)
	_, err = off.get(encodePeerMetadata(nodeIdentity{WorkloadName: "x"}))
	require.NoError(t, err)
	assert.Zero(t, off.m.Len())
}

// Every peer field a configuration may name (statsplan.PeerFields, which the plan checks
// expressions against) is one the workload answers, and with the right value.
func TestWorkloadHasEveryPeerField(t *testing.T) {
	w := newWorkload(nodeIdentity{Name: "pod", Namespace: "ns", WorkloadName: "wl", Owner: "own", ClusterID: "c",
		MeshID: "m", ServiceAccount: "sa", Labels: map[string]string{labelApp: "a", labelVersion: "v",
			labelCanonicalName: "cs", labelCanonicalRevision: "cr"}})
	want := map[string]string{"name": "pod", "namespace": "ns", "workload": "wl", "workload_name": "wl", "owner": "own",
		"cluster": "c", "cluster_id": "c", "mesh_id": "m", "service_account": "sa", "app": "a", "version": "v",
		"canonical_service": "cs", "canonical_revision": "cr"}
	assert.Len(t, statsplan.PeerFields, len(want))
	for _, f := range statsplan.PeerFields {
		v, ok := w.field(f)
		assert.True(t, ok, f)
		assert.Equal(t, want[f], v, f)
	}
	_, ok := w.field("colour")
	assert.False(t, ok)
}
