package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/wasmesh/wasmesh/filters/telemetry/statsplan"
)

func TestDestinationService(t *testing.T) {
	for _, tc := range []struct {
		cluster, authority string
		useHost            bool
		svc, name, ns      string
	}{
		{"outbound|9080||reviews.default.svc.cluster.local", "whatever:80", true,
			"reviews.default.svc.cluster.local", "reviews", "default"},
		{"outbound|9080|v2|reviews.prod.svc.cluster.local", "", false, "reviews.prod.svc.cluster.local", "reviews", "prod"},
		{"inbound|9080||ratings.default.svc.cluster.local", "", true, "ratings.default.svc.cluster.local", "ratings", "default"},
		{"inbound|9080||", "ratings.default.svc.cluster.local:9080", true,
			"ratings.default.svc.cluster.local", "ratings", "default"},
		{"", "ratings.default.svc:9080", true, "ratings.default.svc", "ratings", "default"},
		{"", "httpbin.org", true, "httpbin.org", "httpbin.org", ""},
		{"", "[::1]:8080", true, "[::1]", "[::1]", ""},
		{"", "[::1]", true, "[::1]", "[::1]", ""},
		{"", "httpbin.org", false, "unknown", "unknown", ""},
		{"outbound|443||api.example.com", "", true, "api.example.com", "api.example.com", ""},
		{"PassthroughCluster", "httpbin.org:80", true, "httpbin.org", "PassthroughCluster", ""},
		{"BlackHoleCluster", "", true, "unknown", "BlackHoleCluster", ""},
		{"some_static_cluster", "a.b.svc.cluster.local", true, "a.b.svc.cluster.local", "a", "b"},
		{"", "", true, "unknown", "unknown", ""},
	} {
		read := false
		svc, name, ns := destinationService(tc.cluster, func() string { read = true; return tc.authority }, tc.useHost)
		assert.Equal(t, []string{tc.svc, tc.name, tc.ns}, []string{svc, name, ns}, "%q %q %v", tc.cluster, tc.authority, tc.useHost)
		assert.Equal(t, tc.useHost && clusterHost(tc.cluster) == "", read, "the authority is read only when it is used: %q %v", tc.cluster, tc.useHost)
	}
}

func TestResponseFlags(t *testing.T) {
	for bits, want := range map[uint64]string{
		0:                   "-",
		0x2:                 "UH",
		0x20:                "UF",
		0x100:               "NR",
		0x8000:              "URX",
		0x4000:              "DC",
		0x20 | 0x8000:       "UF,URX",
		0x1 | 0x10000000:    "LH,DR",
		0x80000:             "UMSDR",
		1 << 40:             "-", // unknown bits are ignored
		0x800 | 0x4 | 1<<40: "UT,RL",
	} {
		assert.Equal(t, want, responseFlags(bits), "%#x", bits)
	}
}

func TestRequestProtocol(t *testing.T) {
	assert.True(t, isGRPC("application/grpc"))
	assert.True(t, isGRPC("application/grpc+proto"))
	assert.False(t, isGRPC("application/json"))
	assert.False(t, isGRPC(""))
}

func TestSetWorkloadLabels(t *testing.T) {
	vals := make([]string, statsplan.NumStandardLabels)
	setWorkloadLabels(vals, true, nil)
	setWorkloadLabels(vals, false, newWorkload(nodeIdentity{WorkloadName: "w", Namespace: "ns", ClusterID: "c1",
		Labels: map[string]string{"app": "a"}}))
	got := map[string]string{}
	for i, v := range vals {
		if v != "" {
			got[statsplan.StandardLabelNames[i]] = v
		}
	}
	assert.Equal(t, map[string]string{
		"source_workload": "unknown", "source_workload_namespace": "unknown", "source_app": "unknown",
		"source_version": "unknown", "source_canonical_service": "unknown", "source_canonical_revision": "unknown",
		"source_cluster":       "unknown",
		"destination_workload": "w", "destination_workload_namespace": "ns", "destination_app": "a",
		"destination_version": "unknown", "destination_canonical_service": "a", "destination_canonical_revision": "latest",
		"destination_cluster": "c1",
	}, got)
}

// A status code is its decimal form, from the table for the codes proxies send and
// computed for any other (a negative one, one past the table).
func TestStatusText(t *testing.T) {
	table := newStatusTable()
	for code, want := range map[int64]string{0: "0", 200: "200", 599: "599", 600: "600", -1: "-1", 1 << 40: "1099511627776"} {
		assert.Equal(t, want, statusText(code, table), code)
	}
}
