// Command sdkguest calls the SDK's host functions from a real wasip1 module, so the
// wasip1 layer (memory handed to the host, results copied back, arguments encoded) is
// tested against the real host. The request header x-op picks what to do; results come
// back as response headers.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/proxywasm"
)

func init() { proxywasm.SetVMContext(&vmContext{}) }

func main() {}

type vmContext struct{ types.DefaultVMContext }

func (*vmContext) NewPluginContext(uint32) types.PluginContext { return &pluginContext{} }

type pluginContext struct{ types.DefaultPluginContext }

func (*pluginContext) NewHttpContext(uint32) types.HttpContext { return &httpContext{} }

type httpContext struct {
	types.DefaultHttpContext
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

// sink keeps the loop ops' results alive.
var sink []byte

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
			buf, _ = proxywasm.AppendProperty(buf[:0], []string{"request", "path"})
		case "loop-property-alloc":
			buf, _ = proxywasm.GetProperty([]string{"request", "path"})
		case "loop-header":
			buf, _ = proxywasm.AppendHttpRequestHeader(buf[:0], ":path")
		case "loop-metric":
			counter.Increment(1)
		case "loop-raw-property":
			// The floor under AppendProperty: the import called directly with an encoded
			// path and fixed result slots.
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
		// Larger than the SDK's result arena: the overflow path.
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
		b, cas3, err6 := proxywasm.AppendSharedData([]byte("pre:"), "k")
		b, _, err7 := proxywasm.AppendSharedData(b, "nope")
		h.set("x-shared", strings.Join([]string{errText(err1), string(v), errText(err2), errText(err3),
			errText(err4), string(v2), errText(err5), string(b), strconv.FormatBool(cas3 > cas), errText(err6), errText(err7)}, ","))
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
	case "append":
		b, err1 := proxywasm.AppendProperty([]byte("pre:"), []string{"request", "path"})
		b, err2 := proxywasm.AppendProperty(b, []string{"no", "such"})
		b, err3 := proxywasm.AppendHttpRequestHeader(append(b, '|'), "x-in")
		b, err4 := proxywasm.AppendHttpRequestHeader(b, "x-missing")
		h.set("x-append", string(b)+"/"+errText(err1)+","+errText(err2)+","+errText(err3)+","+errText(err4))
	case "foreign":
		b, err := proxywasm.CallForeignFunction("echo", []byte("ping"))
		h.set("x-foreign", string(b)+"/"+errText(err))
	case "retain":
		// Kept across callbacks while many more host calls reuse the memory results
		// came in.
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
	if h.op == "append" {
		b, err := proxywasm.AppendHttpResponseHeader([]byte("status:"), ":status")
		h.set("x-append-response", string(b)+"/"+errText(err))
		for _, kv := range h.out[len(h.out)-1:] {
			_ = proxywasm.AddHttpResponseHeader(kv[0], kv[1])
		}
	}
	if h.op == "retain" {
		_ = proxywasm.AddHttpResponseHeader("x-retained", h.retained)
	}
	return types.ActionContinue
}

//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize uint32, returnData, returnSize *uint32) uint32

var (
	rawPath    = []byte("request\x00path")
	rawResults = new([2]uint32)
)

func rawProperty() {
	hostGetProperty(&rawPath[0], uint32(len(rawPath)), &rawResults[0], &rawResults[1])
}
