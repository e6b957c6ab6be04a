package e2e

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/testenv/localmesh"
)

func nilCtx() context.Context { return context.Background() }

func getURL(url string) ([]byte, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// proxyCounters reads the pod proxy's stats whose names match filter (a regular
// expression, as the admin API's /stats?filter= takes), by name. The stats must pass the
// proxy's inclusion list (sidecar.istio.io/statsInclusion* annotations).
func proxyCounters(t *testing.T, ctx context.Context, p *localmesh.Pod, filter string) map[string]int64 {
	t.Helper()
	b, err := p.Admin(ctx, "/stats?filter="+url.QueryEscape(filter))
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		require.NoError(t, err, line)
		out[name] = n
	}
	return out
}
