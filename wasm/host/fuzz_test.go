package host

import (
	"context"
	"testing"

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
// whose memory the fuzzer corrupts may crash; the instance is then replaced.
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
	fx := newFixture(f, "kitchen", PluginConfig{}, Environment{HTTPCalls: &fakeUpstream{}})
	ctx := context.Background()
	var s *HTTPStream
	f.Fuzz(func(t *testing.T, fn, a, b, c, d, e uint32) {
		if s == nil || s.Failed() != nil {
			var err error
			s, err = fx.p.NewHTTPStream(ctx, StreamOptions{})
			require.NoError(t, err)
			s.OnRequestHeaders(ctx, NewHeaders([2]string{":path", "/"}), false)
		}
		in := s.in
		in.enter()
		defer in.leave()
		v := in.vm
		if v == nil || v != s.v {
			s = nil
			return
		}
		exp := v.mod.ExportedFunction("fuzz_hostcall")
		require.NotNil(t, exp)
		v.fns["fuzz_hostcall"] = exp
		vc := &vmCall{vm: v, effective: s.id, callback: "fuzz_hostcall", sync: &s.streamCore}
		ret, _, err := v.call(vc, "fuzz_hostcall", uint64(fn), uint64(a), uint64(b), uint64(c), uint64(d), uint64(e))
		if err != nil {
			s.failed = in.fail(v, err, &s.streamCore)
			return
		}
		if Status(ret) > StatusUnimplemented {
			t.Fatalf("host call %d returned status %d", fn%16, ret)
		}
	})
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
