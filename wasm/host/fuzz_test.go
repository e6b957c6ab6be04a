package host

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func FuzzDecodePairs(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0})
	f.Add(EncodePairs([][2]string{{"a", "1"}, {"b", "22"}}))
	f.Add(EncodePairs([][2]string{{":path", "/"}, {"", ""}}))
	f.Add([]byte{1, 0, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 'a'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4})
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'x', 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		pairs, err := DecodePairs(data)
		if err != nil {
			return
		}
		back, err := DecodePairs(EncodePairs(pairs))
		if err != nil {
			t.Fatalf("re-encoding %q failed: %v", pairs, err)
		}
		if len(back) != len(pairs) {
			t.Fatalf("round trip changed %q to %q", pairs, back)
		}
		for i := range back {
			if back[i] != pairs[i] {
				t.Fatalf("round trip changed %q to %q", pairs, back)
			}
		}
	})
}

// FuzzPropertyPath resolves arbitrary paths against a stream with every kind of attribute:
// resolution must never panic and only answer Ok, NotFound or SerializationFailure.
func FuzzPropertyPath(f *testing.F) {
	for _, seed := range []string{"", "\x00", "request\x00path", "request\x00headers\x00foo", "node\x00metadata\x00LABELS\x00app",
		"xds\x00node\x00id", "request", "list\x001", "list\x00-1", "list\x0099999999999999999999", "a\x00\x00b\x00",
		"response\x00code", "connection\x00mtls", "source\x00port", "wasmesh.test"} {
		f.Add([]byte(seed))
	}
	p := &Plugin{cfg: PluginConfig{Name: "n", RootID: "r", VMID: "v"}, env: Environment{Properties: map[string]any{
		"node": Node{ID: "id", Metadata: map[string]any{"LABELS": map[string]any{"app": "x"}, "N": 1.5}}.Property(),
		"list": []any{"a", int64(2), map[string]any{"k": true}},
	}}}
	v := &vm{p: p, contexts: map[uint32]*guestContext{}}
	s := &HTTPStream{reqH: NewHeaders([2]string{":path", "/a?b"}, [2]string{"foo", "1"}),
		respH: NewHeaders([2]string{":status", "x"})}
	s.p = p
	s.info = streamInfo()
	s.filterState = map[string][]byte{"wasmesh.test": []byte("v")}
	v.contexts[2] = &guestContext{id: 2, http: s}
	vc := &vmCall{vm: v, effective: 2}
	f.Fuzz(func(t *testing.T, path []byte) {
		_, st := vc.getProperty(SplitPath(path))
		switch st {
		case StatusOK, StatusNotFound, StatusSerializationFailure:
		default:
			t.Fatalf("path %q: status %v", path, st)
		}
	})
}

// FuzzHostCalls calls host functions from a real guest with arbitrary arguments (pointers,
// sizes, map and buffer types): the host must answer with a status, never panic. A guest
// whose memory the call corrupts may trap; a panic in the host may not.
//
// Each input runs on a plugin of its own (a fresh instance, root context and stream) and
// starts with no shared data or queues for its vm_id, so what one input does (headers or
// buffers set, a local response sent, an HTTP call dispatched, shared data written, guest
// memory overwritten) cannot change the next one's outcome. Only the runtime and the
// compiled module are reused, which no host call changes: a runtime per input costs about
// 100 ms, a plugin about 10 ms.
func FuzzHostCalls(f *testing.F) {
	f.Add(uint32(0), uint32(2), uint32(0xFFFFFFF0), uint32(100), uint32(0), uint32(0))
	f.Add(uint32(1), uint32(0), uint32(0), uint32(0xFFFFFF00), uint32(0xFFFFFF00), uint32(0))
	f.Add(uint32(3), uint32(0), uint32(16), uint32(4), uint32(0x10000000), uint32(8))
	f.Add(uint32(4), uint32(0), uint32(1024), uint32(0xFFFFFFFF), uint32(0), uint32(0))
	f.Add(uint32(6), uint32(6), uint32(0xFFFFFFFF), uint32(0xFFFFFFFF), uint32(64), uint32(68))
	f.Add(uint32(7), uint32(0), uint32(0), uint32(0), uint32(0xFFFF0000), uint32(0xFFFF))
	f.Add(uint32(8), uint32(200), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(11), uint32(9), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(12), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(13), uint32(99), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(14), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0))
	// 31 is proxy_grpc_call (15 with bit 16 set; 15 alone resolves a shared queue).
	f.Add(uint32(31), uint32(0), uint32(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(31), uint32(0), uint32(0x100), uint32(8), uint32(0x200), uint32(0))
	fx := newFixture(f, "kitchen", PluginConfig{}, Environment{})
	f.Fuzz(func(t *testing.T, fn, a, b, c, d, e uint32) {
		ret, err := fuzzHostCall(t, fx.rt, fx.p.Module(), fn, a, b, c, d, e)
		if err != nil {
			if hostPanicked(err) {
				t.Fatalf("host call %d(%#x, %#x, %#x, %#x, %#x) panicked in the host: %v", fn%16, a, b, c, d, e, err)
			}
			return // the guest trapped: its memory was overwritten
		}
		if Status(ret) > StatusUnimplemented {
			t.Fatalf("host call %d returned status %d", fn%16, ret)
		}
	})
}

const fuzzVMID = "fuzz"

// fuzzHostCall runs the kitchen guest's fuzz_hostcall once on a new plugin, during a
// stream's request headers, and then closes the plugin and forgets its vm_id's shared data
// and queues.
func fuzzHostCall(t *testing.T, rt *Runtime, mod *Module, fn, a, b, c, d, e uint32) (uint64, error) {
	ctx := context.Background()
	p, err := rt.NewPlugin(ctx, mod, PluginConfig{Name: "fuzz", VMID: fuzzVMID},
		Environment{HTTPCalls: &fakeUpstream{}, GRPCCalls: &grpcUpstream{}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer func() {
		closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = p.Close(closeCtx)
		rt.forgetVM(fuzzVMID)
	}()
	s, err := p.NewHTTPStream(ctx, StreamOptions{})
	require.NoError(t, err)
	s.OnRequestHeaders(ctx, NewHeaders([2]string{":path", "/"}), false)
	require.Nil(t, s.Failed())
	in := s.in
	in.enter()
	defer in.leave()
	v := in.vm
	require.Same(t, s.v, v)
	exp := v.mod.ExportedFunction("fuzz_hostcall")
	require.NotNil(t, exp)
	v.exports["fuzz_hostcall"] = &export{fn: exp, params: 6, results: 1}
	vc := &vmCall{vm: v, effective: s.id, callback: "fuzz_hostcall", sync: &s.streamCore}
	ret, exported, err := v.call(vc, "fuzz_hostcall", uint64(fn), uint64(a), uint64(b), uint64(c), uint64(d), uint64(e))
	require.True(t, exported, "fuzz_hostcall was not called")
	if err != nil {
		s.failed = in.fail(v, err, &s.streamCore)
	}
	return ret, err
}

// hostPanicked reports whether a failed call panicked in Go (wazero recovers it and says
// so) for another reason than the host's own ways of unwinding the guest: proc_exit and a
// nested guest call that failed.
func hostPanicked(err error) bool {
	var pe *procExit
	var ga *guestAbort
	return strings.Contains(err.Error(), "(recovered by wazero)") && !errors.As(err, &pe) && !errors.As(err, &ga)
}

// forgetVM drops the shared data and queues of vmID, as if no plugin of it had run.
func (r *Runtime) forgetVM(vmID string) {
	r.data.mu.Lock()
	delete(r.data.byVM, vmID)
	r.data.cas = 0
	r.data.mu.Unlock()
	r.queues.mu.Lock()
	defer r.queues.mu.Unlock()
	for k, tok := range r.queues.byName {
		if k.vmID == vmID {
			delete(r.queues.byName, k)
			delete(r.queues.queues, tok)
		}
	}
}

// FuzzGuestMemory reads and bounds-checks arbitrary windows of a real instance's memory.
func FuzzGuestMemory(f *testing.F) {
	f.Add(uint32(0), uint32(0))
	f.Add(uint32(0xFFFFFFFF), uint32(1))
	f.Add(uint32(1), uint32(0xFFFFFFFF))
	f.Add(uint32(65535), uint32(2))
	fx := newFixture(f, "kitchen", PluginConfig{}, Environment{})
	in := fx.p.instances[0]
	in.enter()
	mem := in.vm.mod.Memory()
	in.leave()
	f.Fuzz(func(t *testing.T, ptr, size uint32) {
		in.enter()
		defer in.leave()
		inBounds := uint64(ptr)+uint64(size) <= uint64(mem.Size())
		b, ok := readBytes(mem, ptr, size)
		if ok != (size == 0 || inBounds) || (ok && len(b) != int(size)) {
			t.Fatalf("readBytes(%d, %d) = %d bytes, %v (memory %d)", ptr, size, len(b), ok, mem.Size())
		}
		if _, ok := readString(mem, ptr, size); ok != (size == 0 || inBounds) {
			t.Fatalf("readString(%d, %d) = %v", ptr, size, ok)
		}
		if canWrite(mem, ptr, size) != inBounds {
			t.Fatalf("canWrite(%d, %d) disagrees with the bounds", ptr, size)
		}
	})
}
