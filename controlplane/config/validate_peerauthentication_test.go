package config

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	security "istio.io/api/security/v1beta1"
)

const paHeader = `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: default}
`

func TestPeerAuthenticationRejections(t *testing.T) {
	runRejections(t, paHeader, []extCase{
		{"port level without selector", `spec: {mtls: {mode: STRICT}, portLevelMtls: {8080: {mode: DISABLE}}}`, "spec.portLevelMtls", "cannot set port-level"},
		{"port level with empty selector", `spec: {selector: {matchLabels: {}}, portLevelMtls: {8080: {mode: DISABLE}}}`, "spec.portLevelMtls", "cannot set port-level"},
		{"empty port level", `spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {}}`, "spec.portLevelMtls", "at least one port"},
		{"port zero", `spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {0: {mode: DISABLE}}}`, "spec.portLevelMtls.0", "out of range 1-65535"},
		{"port too big", `spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {65536: {mode: DISABLE}}}`, "spec.portLevelMtls.65536", "out of range 1-65535"},
		{"unknown mode", `spec: {mtls: {mode: TIGHT}}`, "spec", "TIGHT"},
		{"unknown port mode number", `spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {8080: {mode: 7}}}`, "spec.portLevelMtls.8080.mode", "unknown mode 7"},
		{"bad label key", `spec: {selector: {matchLabels: {"": a}}}`, "spec.selector.matchLabels", "invalid label key"},
	})
}

func TestPeerAuthenticationAccepted(t *testing.T) {
	for name, doc := range map[string]string{
		"mesh or namespace":  `spec: {mtls: {mode: STRICT}}`,
		"empty spec":         `spec: {}`,
		"workload and ports": `spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}, portLevelMtls: {1: {mode: DISABLE}, 65535: {mode: UNSET}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			docs := ParseFile("pa.yaml", []byte(paHeader+doc))
			require.Len(t, docs, 1)
			require.Nil(t, docs[0].Err)
			assert.IsType(t, &security.PeerAuthentication{}, docs[0].Config.Spec)
		})
	}
}

// A config keeps its creationTimestamp (Istio ranks conflicting policies oldest first); a
// malformed one is refused naming the field.
func TestCreationTimestampKept(t *testing.T) {
	doc := "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: pa, namespace: default, creationTimestamp: %s}\nspec: {}\n"
	docs := ParseFile("pa.yaml", []byte(fmt.Sprintf(doc, "2024-05-01T10:00:00Z")))
	require.Len(t, docs, 1)
	require.Nil(t, docs[0].Err)
	assert.Equal(t, time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC), docs[0].Config.Created.UTC())
	docs = ParseFile("pa.yaml", []byte(fmt.Sprintf(doc, "yesterday")))
	require.NotNil(t, docs[0].Err)
	assert.Equal(t, "metadata.creationTimestamp", docs[0].Err.Field)
	docs = ParseFile("pa.yaml", []byte("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: pa}\nspec: {}\n"))
	require.Nil(t, docs[0].Err)
	assert.True(t, docs[0].Config.Created.IsZero())
}
