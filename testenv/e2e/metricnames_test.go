package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

// requireCleanNames scrapes a pod's merged page and checks that no tag the filters encode
// in a metric name (tag=.=value;.;) is left in a series name: the bootstrap's stats_tags
// extract every one into a label. A tag they miss reaches Prometheus in the name, its
// separators sanitized to "___" (metric___istio_requests_total___wasmesh_...).
func requireCleanNames(t *testing.T, ctx context.Context, p *localmesh.Pod) localmesh.Metrics {
	t.Helper()
	page, err := p.Scrape(ctx)
	require.NoError(t, err)
	ms, err := localmesh.ParseMetrics(page)
	require.NoError(t, err, "%s's merged page parses", p.Spec.Name)
	require.NotEmpty(t, ms)
	for name := range ms {
		assert.NotContains(t, name, "___", "%s: a tag is left in the name of %s", p.Spec.Name, name)
	}
	for _, line := range strings.Split(string(page), "\n") {
		if strings.Contains(line, "=.=") || strings.Contains(line, ";.;") {
			assert.Failf(t, "an encoded tag reaches the page", "%s: %s", p.Spec.Name, line)
		}
	}
	return ms
}
