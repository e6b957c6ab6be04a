package proxyconfig

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEffectiveLayers(t *testing.T) {
	pc, err := Effective(Layers{
		Env: "drainDuration: 0.5s\nextraStatTags: [a]\nconcurrency: 4\n",
		Annotations: map[string]string{
			AnnotationKey: `{"terminationDrainDuration":"2s","extraStatTags":["b"]}`,
		},
	})
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, pc.GetDrainDuration().AsDuration())
	assert.Equal(t, 2*time.Second, pc.GetTerminationDrainDuration().AsDuration())
	assert.Equal(t, []string{"b"}, pc.GetExtraStatTags(), "the annotation replaces the list")
	assert.EqualValues(t, 4, pc.GetConcurrency().GetValue())
	assert.Equal(t, "/etc/istio/proxy", pc.GetConfigPath(), "defaults stay where no layer sets a field")
}

func TestBadInputNamesSourceAndField(t *testing.T) {
	_, err := Effective(Layers{Env: "drainDurations: 5s"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PROXY_CONFIG")
	assert.Contains(t, err.Error(), "drainDurations")

	_, err = Effective(Layers{Annotations: map[string]string{AnnotationKey: "concurrency: many"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), AnnotationKey)

	_, err = Effective(Layers{Env: "{not yaml"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PROXY_CONFIG")
}
