package discovery_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/adsc"
	"github.com/wasmesh/wasmesh/controlplane/discovery"
)

// With --mtls, config_dump says which mTLS mode each inbound port of the proxy accepts and
// which PeerAuthentications decided it (as istioctl x describe), and the listeners follow it.
func TestConfigDumpShowsInboundMTLS(t *testing.T) {
	pa := `
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: frontend, namespace: demo}
spec:
  selector: {matchLabels: {app: frontend}}
  mtls: {mode: STRICT}
  portLevelMtls: {8080: {mode: DISABLE}}
`
	e := start(t, map[string]string{"services.yaml": services + pa}, func(o *discovery.Options) { o.MTLS = true })
	fe := e.connect(adsc.Config{Node: node(t, "frontend-1", "frontend", "127.10.0.1", "127.20.0.1")})
	wait(t, fe, has(adsc.ListenerType, "127.10.0.1_8080"))
	var dump struct {
		MTLS struct {
			Generated bool     `json:"generated"`
			Mode      string   `json:"workloadMode"`
			Policies  []string `json:"policies"`
			Ports     []struct {
				Port uint32 `json:"port"`
				Mode string `json:"mode"`
			} `json:"ports"`
		} `json:"mtls"`
	}
	body := httpGet(t, "http://"+e.d.HTTPAddr()+"/debug/config_dump?proxyID=sidecar~127.10.0.1~frontend-1.demo~demo.svc.cluster.local")
	require.NoError(t, json.Unmarshal([]byte(body), &dump), body[:min(len(body), 300)])
	assert.True(t, dump.MTLS.Generated)
	assert.Equal(t, "STRICT", dump.MTLS.Mode)
	assert.Equal(t, []string{"demo/frontend"}, dump.MTLS.Policies)
	require.Len(t, dump.MTLS.Ports, 1)
	assert.Equal(t, uint32(8080), dump.MTLS.Ports[0].Port)
	assert.Equal(t, "DISABLE", dump.MTLS.Ports[0].Mode)
	assert.Contains(t, body, `"transportProtocol": "raw_buffer"`, "the DISABLEd port's chain")
}
