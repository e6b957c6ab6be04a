package host

// A minimal wasm binary encoder for hand-made test modules: command-style modules
// (_start), modules importing wasi_unstable, modules without an ABI marker. Only what the
// tests need: i32 functions, one memory, data segments.

type wfunc struct {
	name    string // export name; "" for none
	params  int    // i32 params
	results int    // 0 or 1 i32 result
	body    []byte // instructions, without the final end
}

type wimport struct {
	module, name    string
	params, results int
}

type wmodule struct {
	imports  []wimport
	funcs    []wfunc
	memPages uint32
	data     map[uint32][]byte
	start    int // index (in funcs) of the start function, or -1
}

func uleb(v uint64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, b|0x80)
			continue
		}
		return append(out, b)
	}
}

func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func wname(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func wvec(items [][]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(content)))...), content...)
}

func functype(params, results int) []byte {
	t := []byte{0x60}
	t = append(t, uleb(uint64(params))...)
	for i := 0; i < params; i++ {
		t = append(t, 0x7f)
	}
	t = append(t, uleb(uint64(results))...)
	for i := 0; i < results; i++ {
		t = append(t, 0x7f)
	}
	return t
}

// Instructions.
func i32const(v int32) []byte { return append([]byte{0x41}, sleb(int64(v))...) }

var i32load = []byte{0x28, 0x02, 0x00}

func call(idx int) []byte { return append([]byte{0x10}, uleb(uint64(idx))...) }

var drop = []byte{0x1a}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func (m wmodule) encode() []byte {
	out := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	var types [][]byte
	for _, im := range m.imports {
		types = append(types, functype(im.params, im.results))
	}
	for _, f := range m.funcs {
		types = append(types, functype(f.params, f.results))
	}
	out = append(out, section(1, wvec(types))...)
	var imps [][]byte
	for i, im := range m.imports {
		imps = append(imps, cat(wname(im.module), wname(im.name), []byte{0x00}, uleb(uint64(i))))
	}
	out = append(out, section(2, wvec(imps))...)
	var fidx [][]byte
	for i := range m.funcs {
		fidx = append(fidx, uleb(uint64(len(m.imports)+i)))
	}
	out = append(out, section(3, wvec(fidx))...)
	out = append(out, section(5, wvec([][]byte{cat([]byte{0x00}, uleb(uint64(m.memPages)))}))...)
	exps := [][]byte{cat(wname("memory"), []byte{0x02, 0x00})}
	for i, f := range m.funcs {
		if f.name != "" {
			exps = append(exps, cat(wname(f.name), []byte{0x00}, uleb(uint64(len(m.imports)+i))))
		}
	}
	out = append(out, section(7, wvec(exps))...)
	if m.start >= 0 {
		out = append(out, section(8, uleb(uint64(len(m.imports)+m.start)))...)
	}
	var codes [][]byte
	for _, f := range m.funcs {
		body := cat([]byte{0x00}, f.body, []byte{0x0b})
		codes = append(codes, cat(uleb(uint64(len(body))), body))
	}
	out = append(out, section(10, wvec(codes))...)
	if len(m.data) > 0 {
		var segs [][]byte
		for off, b := range m.data {
			segs = append(segs, cat([]byte{0x00}, i32const(int32(off)), []byte{0x0b}, uleb(uint64(len(b))), b))
		}
		out = append(out, section(11, wvec(segs))...)
	}
	return out
}

// commandModule is a WASI-command-style guest: it logs through proxy_log and
// wasi_unstable.fd_write from _start, then exits 0; it exports no stream callbacks.
func commandModule(marker string) []byte {
	msg := "started via _start"
	return wmodule{
		imports: []wimport{
			{"env", "proxy_log", 3, 1},
			{"wasi_unstable", "fd_write", 4, 1},
			{"wasi_snapshot_preview1", "proc_exit", 1, 0},
		},
		funcs: []wfunc{
			{name: "_start", body: cat(
				i32const(2), i32const(100), i32const(int32(len(msg))), call(0), drop,
				i32const(1), i32const(200), i32const(1), i32const(400), call(1), drop,
				i32const(0), call(2),
			)},
			{name: marker},
			{name: "proxy_on_memory_allocate", params: 1, results: 1, body: i32const(1024)},
			{name: "proxy_on_configure", params: 2, results: 1, body: i32const(1)},
		},
		memPages: 1,
		start:    -1,
		data: map[uint32][]byte{
			100: []byte(msg),
			200: {44, 1, 0, 0, 13, 0, 0, 0}, // iovec{ptr: 300, len: 13}
			300: []byte("hello stdout\n"),
		},
	}.encode()
}

// startSectionModule reads plugin_root_id from its wasm start function, that is while it is
// being instantiated (as AssemblyScript's proxy-runtime can), and logs it.
func startSectionModule() []byte {
	path := "plugin_root_id"
	return wmodule{
		imports: []wimport{
			{"env", "proxy_log", 3, 1},
			{"env", "proxy_get_property", 4, 1},
		},
		funcs: []wfunc{
			{body: cat(
				i32const(100), i32const(int32(len(path))), i32const(200), i32const(204), call(1), drop,
				i32const(2), i32const(200), i32load, i32const(204), i32load, call(0), drop,
			)},
			{name: "proxy_abi_version_0_2_1"},
			{name: "proxy_on_memory_allocate", params: 1, results: 1, body: i32const(1024)},
		},
		memPages: 1,
		start:    0,
		data:     map[uint32][]byte{100: []byte(path)},
	}.encode()
}
