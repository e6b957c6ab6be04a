// Command example is a small proxy-wasm HTTP filter that proves the whole path from Go
// source to a proxy: it counts requests in a counter, sets a configured header on every
// response and answers 403 to requests under a configured path prefix. Build it as a
// reactor with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o example.wasm ./example
//
// The configuration is described on config.
package main

import (
	"errors"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/internal/guestgc"
)

// init registers the VM context: a reactor's host runs _initialize (package
// initialisers), never main.
func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct {
	types.DefaultPluginContext
	cfg      config
	requests proxywasm.MetricCounter
}

func (p *pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	data, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) { // not found: no configuration
		proxywasm.LogCriticalf("example: reading plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	cfg, err := parseConfig(data)
	if err != nil {
		proxywasm.LogCriticalf("example: %v", err)
		return types.OnPluginStartStatusFailed
	}
	p.cfg = cfg
	p.requests = proxywasm.DefineCounterMetric(cfg.Counter)
	return types.OnPluginStartStatusOK
}

func (p *pluginContext) NewHttpContext(uint32) types.HttpContext {
	return &httpContext{plugin: p}
}

type httpContext struct {
	types.DefaultHttpContext
	plugin *pluginContext
}

func (h *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	h.plugin.requests.Increment(1)
	path, err := proxywasm.GetHttpRequestHeader(":path")
	if err != nil {
		// No :path (not HTTP, or the host hides it): nothing to deny.
		return types.ActionContinue
	}
	if !h.plugin.cfg.denied(path) {
		return types.ActionContinue
	}
	headers, body := h.plugin.cfg.denyResponse()
	if err := proxywasm.SendHttpResponse(403, headers, body, -1); err != nil {
		proxywasm.LogErrorf("example: sending 403 for %q: %v", path, err)
		return types.ActionContinue
	}
	return types.ActionPause
}

// OnHttpResponseHeaders sets rather than adds the header: Envoy runs a local reply through
// the response callbacks too, and the 403 already carries it.
func (h *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	for _, kv := range h.plugin.cfg.responseHeaders() {
		if err := proxywasm.ReplaceHttpResponseHeader(kv[0], kv[1]); err != nil {
			proxywasm.LogErrorf("example: setting response header %q: %v", kv[0], err)
		}
	}
	return types.ActionContinue
}

// OnHttpStreamDone lets the collector keep the heap small (guestgc).
func (h *httpContext) OnHttpStreamDone() { guestgc.StreamDone() }
