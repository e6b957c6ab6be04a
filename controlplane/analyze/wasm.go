package analyze

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	extensions "istio.io/api/extensions/v1alpha1"

	"github.com/wasmesh/wasmesh/controlplane/config"
	"github.com/wasmesh/wasmesh/controlplane/wasmfetch"
)

// wasmPlugins: each WasmPlugin's module can be had (a file:// path read, an http(s) URL
// fetched, 30 s at most, Istio's) and matches its sha256 when one is given. Discovery leaves
// a plugin whose module fails out of every proxy's configuration.
func wasmPlugins(in *input) []Message {
	var out []Message
	client := &http.Client{Timeout: 30 * time.Second}
	for _, d := range in.kind(config.WasmPlugin) {
		wp := d.cfg.Spec.(*extensions.WasmPlugin)
		sum, err := moduleDigest(client, wp.GetUrl())
		switch {
		case err != nil:
			out = append(out, at(d, "url", wp.GetUrl(), newMessage(Error, codeWasmModuleUnavailable,
				"The module %s cannot be fetched: %v.", wp.GetUrl(), err)))
		case sum != "" && wp.GetSha256() != "" && !strings.EqualFold(sum, wp.GetSha256()):
			out = append(out, at(d, "sha256", wp.GetSha256(), newMessage(Error, codeWasmModuleUnavailable,
				"The module %s has sha256 %s, not %s: discovery does not apply the plugin.", wp.GetUrl(), sum, wp.GetSha256())))
		}
	}
	return out
}

// moduleDigest reads a module and returns its sha256 ("" for a scheme not read offline, an
// oci:// image).
func moduleDigest(client *http.Client, raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if u.Scheme != "file" && u.Scheme != "http" && u.Scheme != "https" {
		return "", nil
	}
	body, err := wasmfetch.Open(context.Background(), client, u)
	if err != nil {
		return "", err
	}
	defer body.Close()
	return wasmfetch.Digest(nil, body, wasmfetch.DefaultMaxSize)
}
