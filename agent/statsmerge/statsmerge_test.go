package statsmerge

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const proxyPage = `# TYPE envoy_server_live gauge
envoy_server_live 1
# TYPE istio_requests_total counter
istio_requests_total{reporter="destination",response_code="200"} 7
`

const appPage = `# HELP app_orders_total Orders.
# TYPE app_orders_total counter
app_orders_total 3
# TYPE istio_requests_total counter
istio_requests_total 1
# TYPE go_goroutines gauge
go_goroutines 12
# TYPE wasmesh_agent_things gauge
wasmesh_agent_things 1
`

func TestMergedPageParsesWithEachFamilyOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	things := prometheus.NewCounter(prometheus.CounterOpts{Name: "wasmesh_agent_things", Help: "Same name, other type."})
	reg.MustRegister(things)
	agent, err := reg.Gather()
	require.NoError(t, err)
	app, err := ParseText(strings.NewReader(appPage))
	require.NoError(t, err)

	var out bytes.Buffer
	res, err := Write(&out, []byte(proxyPage), app, agent)
	require.NoError(t, err)

	// The parser refuses a family declared twice, so parsing proves there is none.
	fams, err := ParseText(bytes.NewReader(out.Bytes()))
	require.NoError(t, err, out.String())
	byName := map[string]int{}
	for _, f := range fams {
		byName[f.GetName()] = len(f.GetMetric())
	}
	assert.Equal(t, 1, byName["envoy_server_live"])
	assert.Equal(t, 1, byName["istio_requests_total"], "the proxy's family wins")
	assert.Equal(t, 1, byName["app_orders_total"])
	assert.Equal(t, 1, byName["go_goroutines"], "the app's and the agent's unlabeled series collapse to one")
	assert.Contains(t, byName, "go_gc_duration_seconds", "the agent's other families are there")
	assert.Contains(t, out.String(), `istio_requests_total{reporter="destination",response_code="200"} 7`)
	assert.Contains(t, out.String(), "wasmesh_agent_things 1\n")
	assert.ElementsMatch(t, []string{"istio_requests_total", "wasmesh_agent_things"}, res.DroppedFamilies)
	assert.Equal(t, 1, res.DroppedSeries)
}

func TestProxyPageWithoutTrailingNewline(t *testing.T) {
	var out bytes.Buffer
	app, err := ParseText(strings.NewReader("# TYPE a counter\na 1\n"))
	require.NoError(t, err)
	_, err = Write(&out, []byte("# TYPE b gauge\nb 2"), app)
	require.NoError(t, err)
	_, err = ParseText(bytes.NewReader(out.Bytes()))
	require.NoError(t, err, out.String())
}
