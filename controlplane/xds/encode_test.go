package xds

import (
	"bytes"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// testSet has small resources and a large one.
func testSet() *Resources {
	return NewResources([]*Resource{
		NewResource("c", &cluster.Cluster{Name: "c"}),
		NewResource("b", &cluster.Cluster{Name: "b", AltStatName: strings.Repeat("y", 2048)}),
		NewResource("a", &cluster.Cluster{Name: "a", AltStatName: "x"}),
	})
}

func flatten(t *testing.T, e *Encoded) []byte {
	bs, err := NewCodec().Marshal(e)
	require.NoError(t, err)
	var b bytes.Buffer
	for _, buf := range bs {
		b.Write(buf.ReadOnlyData())
	}
	assert.Equal(t, e.Size(), b.Len())
	return b.Bytes()
}

// The hand-encoded responses must decode to exactly the messages proto would have sent.
func TestEncodedResponsesDecodeToTheSameMessages(t *testing.T) {
	set := testSet()
	for _, items := range [][]*Resource{set.Items, set.Items[1:]} {
		var got discovery.DiscoveryResponse
		require.NoError(t, proto.Unmarshal(flatten(t, EncodeSotw("v1", ClusterType, "n1", set, items)), &got))
		want := &discovery.DiscoveryResponse{VersionInfo: "v1", TypeUrl: ClusterType, Nonce: "n1"}
		for _, it := range items {
			want.Resources = append(want.Resources, &anypb.Any{TypeUrl: it.Any.TypeUrl, Value: it.Any.Value})
		}
		assert.True(t, proto.Equal(want, &got), "got %v", &got)

		var gotDelta discovery.DeltaDiscoveryResponse
		require.NoError(t, proto.Unmarshal(flatten(t, EncodeDelta("v2", ClusterType, "n2", set, items, []string{"gone"})), &gotDelta))
		wantDelta := &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "v2", TypeUrl: ClusterType, Nonce: "n2", RemovedResources: []string{"gone"}}
		for _, it := range items {
			wantDelta.Resources = append(wantDelta.Resources, &discovery.Resource{Name: it.Name, Version: VersionOf(it.Hash), Resource: it.Any})
		}
		assert.True(t, proto.Equal(wantDelta, &gotDelta), "got %v", &gotDelta)
	}
	// A plain message still goes through the proto codec.
	b, err := NewCodec().Marshal(&discovery.DiscoveryRequest{TypeUrl: "x"})
	require.NoError(t, err)
	var req discovery.DiscoveryRequest
	require.NoError(t, NewCodec().Unmarshal(b, &req))
	assert.Equal(t, "x", req.GetTypeUrl())
}

// Delta responses carrying some items of a set reference each item's entry, encoded once:
// two connections' responses share the bytes.
func TestDeltaItemsAreEncodedOnce(t *testing.T) {
	set := testSet()
	a := EncodeDelta("v1", ClusterType, "n1", set, set.Items[1:], nil)
	b := EncodeDelta("v1", ClusterType, "n2", set, set.Items[1:], nil)
	require.Len(t, a.parts, 3) // header and the two items
	require.Len(t, b.parts, 3)
	for i := 1; i < 3; i++ {
		assert.Same(t, &a.parts[i][0], &b.parts[i][0], "item %d shares its encoding", i)
	}
	assert.NotEqual(t, a.parts[0], b.parts[0], "each response has its own nonce")
}
