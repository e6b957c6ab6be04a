//go:build wasip1 && !tinygo

package proxywasm

import (
	"runtime/debug"
	"unsafe"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/wasmesh/wasmesh/filters/proxywasm/internal/abi"
	"github.com/wasmesh/wasmesh/filters/proxywasm/internal/hostmem"
	"github.com/wasmesh/wasmesh/filters/proxywasm/internal/vmstate"
)

// guest is the one piece of package-level mutable state, and the ABI forces it: the host
// calls the module's exported functions with nothing but integers, so the contexts the
// filter created and the memory handed to the host must be found from a global. A wasm
// instance is single-threaded and holds exactly one VM, so one value is enough and no
// lock is needed (and none may be held across a host call anyway: the host calls back
// into the guest during them).
var guest = struct {
	vm *vmstate.State
	// mem holds what the host returns from calls, and the slots it writes pointers and
	// sizes to (see hostmem.Arena): allocating each on the Go heap cost more than most
	// host calls.
	mem *hostmem.Arena
	// depth counts the callbacks on the stack; when the outermost returns, no host call
	// is in progress and leftover host allocations can be dropped.
	depth int
	// slots are the result slots of the host calls in progress, by nesting level (see
	// hostResult); calls counts the levels in use.
	slots [8][3]uint32
	calls int
	// paths caches encoded property paths (see encodePath).
	paths [16]cachedPath
}{vm: vmstate.New(effectiveContextHost{}), mem: hostmem.NewArena(arenaSize)}

// arenaSize holds the results of the host calls in progress (usually one at a time: a
// header value, a property); larger results go to the Go heap.
const arenaSize = 16 << 10

// cachedPath is a property path (its segments) and its encoding.
type cachedPath struct {
	path []string
	raw  []byte
}

// gcPercent is the garbage collector's target the SDK sets when the module starts (GOGC,
// which a guest cannot get from its environment). With Go's default of 100 the heap of
// every VM instance grows to at least 4 MiB before the first collection, on top of the
// runtime and the module's data, and linear memory never shrinks; 25 bounds it to about
// 1 MiB. Filters made with the SDK keep little live state and produce little garbage per
// request, so the collections this adds are few and short. A filter can choose otherwise
// with debug.SetGCPercent in its own init, which runs after this one.
const gcPercent = 25

func init() { debug.SetGCPercent(gcPercent) }

type effectiveContextHost struct{}

func (effectiveContextHost) SetEffectiveContext(contextID uint32) error {
	return SetEffectiveContext(contextID)
}

// enter marks the start of a callback run for contextID; leave undoes it. Used as
// `defer leave(enter(id))` in every callback but the allocator.
func enter(contextID uint32) uint32 {
	guest.depth++
	return guest.vm.Enter(contextID)
}

func leave(previous uint32) {
	guest.vm.Leave(previous)
	guest.depth--
	if guest.depth == 0 {
		guest.mem.Reset()
		guest.calls = 0
	}
}

// Exported callbacks. Parameters are uint32 (i32) rather than int, bool or the SDK's
// named types: go:wasmexport takes only fixed-size types, int is 64-bit on GOARCH=wasm,
// and a host's i32 "bool" may be any non-zero value.

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

// proxyOnMemoryAllocate gives the host a buffer to fill with a host call's result, on
// the arena (or, when it does not fit, on the heap, referenced from the overflow table
// until the guest takes it: see hostmem for why that is needed under Go's GC).
//
//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) uint32 {
	return uint32(guest.mem.Alloc(size)) // linear memory addresses fit in 32 bits
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(contextID, parentContextID uint32) {
	defer leave(enter(contextID))
	guest.vm.OnContextCreate(contextID, parentContextID)
}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(pluginContextID, vmConfigurationSize uint32) bool {
	defer leave(enter(pluginContextID))
	return bool(guest.vm.OnVMStart(int(vmConfigurationSize)))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(pluginContextID, pluginConfigurationSize uint32) bool {
	defer leave(enter(pluginContextID))
	return bool(guest.vm.OnConfigure(pluginContextID, int(pluginConfigurationSize)))
}

//go:wasmexport proxy_on_tick
func proxyOnTick(pluginContextID uint32) {
	defer leave(enter(pluginContextID))
	guest.vm.OnTick(pluginContextID)
}

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(pluginContextID, queueID uint32) {
	defer leave(enter(pluginContextID))
	guest.vm.OnQueueReady(pluginContextID, queueID)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpRequestHeaders(int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(contextID, bodySize, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpRequestBody(int(bodySize), endOfStream != 0))
}

//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(contextID, numTrailers uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpRequestTrailers(int(numTrailers)))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(contextID, numHeaders, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpResponseHeaders(int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(contextID, bodySize, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpResponseBody(int(bodySize), endOfStream != 0))
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(contextID, numTrailers uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.HTTPContext(contextID).OnHttpResponseTrailers(int(numTrailers)))
}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(pluginContextID, token, numHeaders, bodySize, numTrailers uint32) {
	defer leave(enter(pluginContextID))
	guest.vm.OnHTTPCallResponse(pluginContextID, token, int(numHeaders), int(bodySize), int(numTrailers))
}

//go:wasmexport proxy_on_log
func proxyOnLog(contextID uint32) {
	defer leave(enter(contextID))
	guest.vm.OnLog(contextID)
}

//go:wasmexport proxy_on_done
func proxyOnDone(contextID uint32) bool {
	defer leave(enter(contextID))
	return guest.vm.OnDone(contextID)
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(contextID uint32) {
	defer leave(enter(contextID))
	guest.vm.OnDelete(contextID)
}

//go:wasmexport proxy_on_new_connection
func proxyOnNewConnection(contextID uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.TCPContext(contextID).OnNewConnection())
}

//go:wasmexport proxy_on_downstream_data
func proxyOnDownstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.TCPContext(contextID).OnDownstreamData(int(dataSize), endOfStream != 0))
}

//go:wasmexport proxy_on_downstream_connection_close
func proxyOnDownstreamConnectionClose(contextID, peerType uint32) {
	defer leave(enter(contextID))
	guest.vm.TCPContext(contextID).OnDownstreamClose(types.PeerType(peerType))
}

//go:wasmexport proxy_on_upstream_data
func proxyOnUpstreamData(contextID, dataSize, endOfStream uint32) uint32 {
	defer leave(enter(contextID))
	return uint32(guest.vm.TCPContext(contextID).OnUpstreamData(int(dataSize), endOfStream != 0))
}

//go:wasmexport proxy_on_upstream_connection_close
func proxyOnUpstreamConnectionClose(contextID, peerType uint32) {
	defer leave(enter(contextID))
	guest.vm.TCPContext(contextID).OnUpstreamClose(types.PeerType(peerType))
}

// hostResult collects a buffer the host returns through proxy_on_memory_allocate. Its
// slots (where the host writes the buffer's address and size, and a CAS for shared data)
// are fixed per nesting level of host calls, and the buffer comes from the arena, so a
// host call allocates nothing on the Go heap. Use:
//
//	var r hostResult
//	r.begin()
//	defer r.end()
//	st := hostGetX(..., r.ptr(), r.size())
//	b, err := r.view(st) // valid until r.end(): copy what outlives it
type hostResult struct {
	slots *[3]uint32
	mark  hostmem.ArenaMark
}

func (r *hostResult) begin() {
	r.mark = guest.mem.Mark()
	if guest.calls < len(guest.slots) {
		r.slots = &guest.slots[guest.calls]
		*r.slots = [3]uint32{}
	} else {
		r.slots = new([3]uint32) // deeper than any real nesting: the heap will do
	}
	guest.calls++
}

func (r *hostResult) ptr() *uint32  { return &r.slots[0] }
func (r *hostResult) size() *uint32 { return &r.slots[1] }
func (r *hostResult) cas() *uint32  { return &r.slots[2] }

// end releases the result and whatever else the host allocated during the call (it may
// have allocated and then failed).
func (r *hostResult) end() {
	guest.calls--
	guest.mem.Release(r.mark)
}

// view returns the buffer the host wrote, valid until end. A zero pointer with an OK
// status comes back as a nil slice and no error; callers that need the SDK's "nil means
// not found" apply it.
func (r *hostResult) view(status uint32) ([]byte, error) {
	if status != abi.StatusOK {
		return nil, abi.StatusError(status)
	}
	if r.slots[0] == 0 {
		return nil, nil
	}
	b, ok := guest.mem.View(uintptr(r.slots[0]), r.slots[1])
	if !ok {
		return nil, errForeignMemory
	}
	return b, nil
}

// owned returns the buffer the host wrote as a slice the caller owns.
func (r *hostResult) owned(status uint32) ([]byte, error) {
	b, err := r.view(status)
	if b == nil {
		return nil, err
	}
	out := make([]byte, len(b))
	copy(out, b)
	return out, nil
}

// scratch returns n bytes on the arena for an argument, valid until the enclosing
// hostResult's end.
func scratch(n int) []byte { return guest.mem.Scratch(n) }

// bytesPtr returns what a host call needs for b: a pointer to its first byte (nil when
// empty, as the SDK passes) and its length.
func bytesPtr(b []byte) (*byte, uint32) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.SliceData(b), uint32(len(b))
}
