package bootstrap

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/wasmesh/wasmesh/agent/proxyconfig"
)

// inputNames are the names an error about the agent's inputs may give: the environment
// variables, the annotations and ProxyConfig fields they carry.
var inputNames = []string{"ISTIO_META_", "ISTIO_DELTA_XDS", "WASMESH_", "INSTANCE_IP", "PROXY_CONFIG",
	"annotation", "ProxyConfig", "discovery address"}

// FuzzAgentEnv runs the agent's inputs as the sidecar reads them (the environment,
// PROXY_CONFIG and the proxy.istio.io/config annotation through proxyconfig.Effective, then
// InputFromEnv and NewParams) and renders the default bootstrap: no panic, every error names
// the input at fault, and inputs accepted render a valid bootstrap.
func FuzzAgentEnv(f *testing.F) {
	f.Add("POD_NAME=web-5d8f7c9b4-x2x9q\nPOD_NAMESPACE=default\nINSTANCE_IP=10.0.0.7\nISTIO_META_CLUSTER_ID=Kubernetes\nISTIO_META_POD_PORTS=[{\"containerPort\":8080,\"protocol\":\"TCP\"}]",
		"discoveryAddress: istiod.istio-system.svc:15012\nconcurrency: 2\nextraStatTags: [a_b]", "", "")
	f.Add("ISTIO_META_INTERCEPTION_MODE=NONE\nWASMESH_LOCALHOST=127.0.0.2\nISTIO_DELTA_XDS=false\nISTIO_META_LABELS={\"app\":\"x\"}",
		`{"drainDuration":"1s","proxyStatsMatcher":{"inclusionRegexps":["a.*"]}}`, "terminationDrainDuration: 2s", "TPROXY")
	f.Add("ISTIO_DELTA_XDS=maybe\nINSTANCE_IP=not-an-ip\nISTIO_META_POD_PORTS={", "concurrency: [", "bogus: 1", "BRIDGE")
	f.Add("ISTIO_META_INSTANCE_IPS=10.0.0.1, ,fe80::1\nPOD_NAME=\"quoted\"\\\nISTIO_META_X=</script>{{", "discoveryAddress: 'host:99999'", "extraStatTags: ['1bad']", "")
	f.Fuzz(func(t *testing.T, envText, proxyConfig, annotation, mode string) {
		env := strings.Split(envText, "\n")
		annotations := map[string]string{proxyconfig.AnnotationKey: annotation}
		if mode != "" {
			annotations[AnnotationInterceptionMode] = mode
		}
		pc, err := proxyconfig.Effective(proxyconfig.Layers{Env: proxyConfig, Annotations: annotations})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "PROXY_CONFIG: ") && !strings.HasPrefix(err.Error(), "annotation "+proxyconfig.AnnotationKey+": ") {
				t.Fatalf("a ProxyConfig error that does not name its source: %v", err)
			}
			return
		}
		in := InputFromEnv(env)
		in.Annotations, in.ProxyConfig = annotations, pc
		p, err := NewParams(in)
		if err != nil {
			if !namesInput(err.Error()) {
				t.Fatalf("the error does not name the input at fault: %v", err)
			}
			return
		}
		out, err := DefaultTemplate().Render(p, nil, "")
		if err != nil {
			t.Fatalf("inputs accepted, but the bootstrap does not render: %v", err)
		}
		if !json.Valid(out) {
			t.Fatalf("rendered bootstrap is not JSON: %s", out)
		}
	})
}

func namesInput(msg string) bool {
	for _, n := range inputNames {
		if strings.Contains(msg, n) {
			return true
		}
	}
	return false
}
