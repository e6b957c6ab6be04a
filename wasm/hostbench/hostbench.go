// Package hostbench runs one filter on the host alone, one instance on a runtime of its
// own, and sends the same exchange through it again and again: what a benchmark compares
// a filter's cost against, without a proxy or the harness's bookkeeping around it.
package hostbench

import (
	"context"
	"fmt"

	"github.com/wasmesh/wasmesh/wasm/host"
)

// Exchange is a request (headers only) and its response.
type Exchange struct {
	Request, Response [][2]string
	// ResponseBody, when set, follows the response headers as one chunk that ends the
	// response; without it the response headers end it.
	ResponseBody []byte
	Info         host.StreamInfo
}

// Filter is one instance of a filter on its own runtime.
type Filter struct {
	// Plugin is the running filter, for its stats, metrics and memory.
	Plugin *host.Plugin
	rt     *host.Runtime
}

// Load compiles code on a new runtime configured by rc, and starts one instance of it with
// cfg and env. The module is compiled with ctx, which may carry wazero's experimental
// options (a function listener). Close releases both.
func Load(ctx context.Context, code []byte, rc host.RuntimeConfig, cfg host.PluginConfig, env host.Environment) (*Filter, error) {
	rt, err := host.NewRuntime(ctx, rc)
	if err != nil {
		return nil, err
	}
	mod, err := rt.Compile(ctx, code)
	if err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("hostbench: compiling %s: %w", cfg.Name, err)
	}
	p, err := rt.NewPlugin(ctx, mod, cfg, env)
	if err != nil {
		_ = rt.Close(ctx)
		return nil, fmt.Errorf("hostbench: starting %s: %w", cfg.Name, err)
	}
	return &Filter{Plugin: p, rt: rt}, nil
}

// Close stops the instance and its runtime.
func (f *Filter) Close(ctx context.Context) error {
	_ = f.Plugin.Close(ctx)
	return f.rt.Close(ctx)
}

// Do sends x through the filter, the request's headers, then the response's headers and
// body, then the stream's end (proxy_on_log, proxy_on_done, proxy_on_delete), and returns
// the response headers as the filter left them.
func (f *Filter) Do(ctx context.Context, x Exchange) (*host.Headers, error) {
	s, err := f.Plugin.NewHTTPStream(ctx, host.StreamOptions{Info: x.Info})
	if err != nil {
		return nil, err
	}
	s.OnRequestHeaders(ctx, host.NewHeaders(x.Request...), true)
	resp := host.NewHeaders(x.Response...)
	s.OnResponseHeaders(ctx, resp, len(x.ResponseBody) == 0)
	if len(x.ResponseBody) > 0 {
		s.OnResponseBody(ctx, x.ResponseBody, true)
	}
	s.Finish(ctx)
	return resp, nil
}
