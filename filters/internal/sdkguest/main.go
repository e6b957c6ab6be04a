// Command sdkguest calls the upstream proxy-wasm Go SDK's host functions from a real
// wasip1 module, so wasmesh's host is tested against the SDK the filters use (memory the
// host allocates in the guest, results read back, arguments encoded), also for the calls
// the mesh's filters do not make. The request header x-op picks what to do; results come
// back as response headers. The loop-* ops time single calls (BenchmarkHostCall); the
// grpc* ops make proxy_grpc_call to the service the plugin configuration names (grpc.go).
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct{ types.DefaultPluginContext }

func (*pluginContext) OnPluginStart(int) types.OnPluginStartStatus {
	if !loadConfig() {
		return types.OnPluginStartStatusFailed
	}
	return types.OnPluginStartStatusOK
}

func (*pluginContext) NewHttpContext(id uint32) types.HttpContext { return &httpContext{id: id} }

type httpContext struct {
	types.DefaultHttpContext
	id       uint32
	op       string
	retained string
	out      [][2]string
}

func (h *httpContext) set(k, v string) { h.out = append(h.out, [2]string{k, v}) }

func errText(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, types.ErrorStatusNotFound):
		return "not_found"
	case errors.Is(err, types.ErrorStatusCasMismatch):
		return "cas_mismatch"
	case errors.Is(err, types.ErrorStatusEmpty):
		return "empty"
	}
	return err.Error()
}

var (
	// sink keeps the loop ops' results alive.
	sink []byte

	pathRequestPath = []string{"request", "path"}
)

// loop runs op n times in one callback, for the per-call benchmarks.
func loop(op string, n int) {
	var buf []byte
	var counter proxywasm.MetricCounter
	if op == "loop-metric" {
		counter = proxywasm.DefineCounterMetric("loop")
	}
	for range n {
		switch op {
		case "loop-property":
			buf, _ = proxywasm.GetProperty(pathRequestPath)
		case "loop-header":
			v, _ := proxywasm.GetHttpRequestHeader(":path")
			buf = append(buf[:0], v...)
		case "loop-metric":
			counter.Increment(1)
		case "loop-raw-property":
			// The floor under GetProperty: the import called directly with an encoded
			// path and fixed result slots (the host still allocates the result in the
			// guest).
			rawProperty()
		case "loop-alloc":
			buf = make([]byte, 16)
			sink = buf
		}
	}
}

func (h *httpContext) OnHttpRequestHeaders(int, bool) types.Action {
	h.op, _ = proxywasm.GetHttpRequestHeader("x-op")
	if strings.HasPrefix(h.op, "loop-") {
		n, _ := proxywasm.GetHttpRequestHeader("x-n")
		count, _ := strconv.Atoi(n)
		loop(h.op, count)
		return types.ActionContinue
	}
	if strings.HasPrefix(h.op, "grpc") {
		if h.grpcStart() {
			return types.ActionPause
		}
		return types.ActionContinue
	}
	switch h.op {
	case "headers":
		hs, err := proxywasm.GetHttpRequestHeaders()
		h.set("x-err", errText(err))
		var names []string
		for _, kv := range hs {
			names = append(names, kv[0]+"="+kv[1])
		}
		h.set("x-all", strings.Join(names, ","))
		v, err := proxywasm.GetHttpRequestHeader("x-in")
		h.set("x-in", v+"/"+errText(err))
		_, err = proxywasm.GetHttpRequestHeader("x-missing")
		h.set("x-missing", errText(err))
	case "property":
		v, err := proxywasm.GetProperty([]string{"request", "path"})
		h.set("x-path", string(v)+"/"+errText(err))
		m, err := proxywasm.GetPropertyMap([]string{"node", "metadata", "LABELS"})
		var labels []string
		for _, kv := range m {
			labels = append(labels, kv[0]+"="+kv[1])
		}
		h.set("x-labels", strings.Join(labels, ",")+"/"+errText(err))
		_, err = proxywasm.GetProperty([]string{"no", "such"})
		h.set("x-missing", errText(err))
	case "big":
		// A result of 40 KiB, far larger than any other.
		v, err := proxywasm.GetHttpRequestHeader("x-big")
		sum := sha256.Sum256([]byte(v))
		h.set("x-big", strconv.Itoa(len(v))+"/"+hex.EncodeToString(sum[:8])+"/"+errText(err))
	case "shared":
		err1 := proxywasm.SetSharedData("k", []byte("v1"), 0)
		v, cas, err2 := proxywasm.GetSharedData("k")
		err3 := proxywasm.SetSharedData("k", []byte("v2"), cas)
		err4 := proxywasm.SetSharedData("k", []byte("v3"), cas)
		v2, _, _ := proxywasm.GetSharedData("k")
		_, _, err5 := proxywasm.GetSharedData("nope")
		_, cas3, err6 := proxywasm.GetSharedData("k")
		h.set("x-shared", strings.Join([]string{errText(err1), string(v), errText(err2), errText(err3),
			errText(err4), string(v2), errText(err5), strconv.FormatBool(cas3 > cas), errText(err6)}, ","))
	case "queue":
		id, err := proxywasm.RegisterSharedQueue("q")
		out := []string{errText(err)}
		for _, item := range []string{"a", "bb"} {
			out = append(out, errText(proxywasm.EnqueueSharedQueue(id, []byte(item))))
		}
		for range 3 {
			b, err := proxywasm.DequeueSharedQueue(id)
			out = append(out, string(b)+"/"+errText(err))
		}
		h.set("x-queue", strings.Join(out, ","))
	case "foreign":
		b, err := proxywasm.CallForeignFunction("echo", []byte("ping"))
		h.set("x-foreign", string(b)+"/"+errText(err))
	case "retain":
		// Kept across callbacks while many more host calls allocate results (and the
		// guest's collector runs).
		h.retained, _ = proxywasm.GetHttpRequestHeader("x-in")
		for range 100 {
			_, _ = proxywasm.GetHttpRequestHeader(":path")
			_, _ = proxywasm.GetProperty([]string{"request", "path"})
		}
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpRequestBody(size int, eos bool) types.Action {
	if h.op != "body" {
		return types.ActionContinue
	}
	if !eos {
		return types.ActionPause
	}
	b, err := proxywasm.GetHttpRequestBody(0, size)
	h.set("x-body", string(b)+"/"+errText(err))
	_, err = proxywasm.GetHttpRequestBody(size+10, 5)
	h.set("x-body-past-end", errText(err))
	return types.ActionContinue
}

func (h *httpContext) OnHttpResponseHeaders(int, bool) types.Action {
	for _, kv := range h.out {
		_ = proxywasm.AddHttpResponseHeader(kv[0], kv[1])
	}
	if h.op == "retain" {
		_ = proxywasm.AddHttpResponseHeader("x-retained", h.retained)
	}
	return types.ActionContinue
}
