// Package wasmgen encodes small wasm modules by hand for tests: command-style modules
// (_start), modules importing wasi_unstable, modules without an ABI marker, loops that
// never end. Only what the tests need: i32 functions, one memory, data segments.
package wasmgen

// Func is a defined function.
type Func struct {
	Name    string // export name; "" for none
	Params  int    // i32 params
	Results int    // 0 or 1 i32 result
	Body    []byte // instructions, without the final end
}

// Import is an imported function.
type Import struct {
	Module, Name    string
	Params, Results int
}

// Module is a module to encode.
type Module struct {
	Imports  []Import
	Funcs    []Func
	MemPages uint32
	// NoMemory leaves the memory (and its export) out.
	NoMemory bool
	Data     map[uint32][]byte
	Start    int // index (in Funcs) of the start function, or -1
}

// ULEB encodes an unsigned LEB128.
func ULEB(v uint64) []byte {
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

// SLEB encodes a signed LEB128.
func SLEB(v int64) []byte {
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

func name(s string) []byte { return append(ULEB(uint64(len(s))), s...) }

func vec(items [][]byte) []byte {
	out := ULEB(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, ULEB(uint64(len(content)))...), content...)
}

func functype(params, results int) []byte {
	t := []byte{0x60}
	t = append(t, ULEB(uint64(params))...)
	for i := 0; i < params; i++ {
		t = append(t, 0x7f)
	}
	t = append(t, ULEB(uint64(results))...)
	for i := 0; i < results; i++ {
		t = append(t, 0x7f)
	}
	return t
}

// Instructions.

// I32Const is i32.const v.
func I32Const(v int32) []byte { return append([]byte{0x41}, SLEB(int64(v))...) }

// Call is call idx (imports first, then defined functions).
func Call(idx int) []byte { return append([]byte{0x10}, ULEB(uint64(idx))...) }

// LocalGet is local.get idx.
func LocalGet(idx int) []byte { return append([]byte{0x20}, ULEB(uint64(idx))...) }

// LocalSet is local.set idx.
func LocalSet(idx int) []byte { return append([]byte{0x21}, ULEB(uint64(idx))...) }

// Br is br depth; BrIf is br_if depth.
func Br(depth int) []byte   { return append([]byte{0x0c}, ULEB(uint64(depth))...) }
func BrIf(depth int) []byte { return append([]byte{0x0d}, ULEB(uint64(depth))...) }

// Instructions without immediates.
var (
	I32Load = []byte{0x28, 0x02, 0x00}
	Drop    = []byte{0x1a}
	Loop    = []byte{0x03, 0x40} // loop with no result
	Block   = []byte{0x02, 0x40}
	End     = []byte{0x0b}
	I32Add  = []byte{0x6a}
	I32Sub  = []byte{0x6b}
	I32Eqz  = []byte{0x45}
)

// Cat concatenates instructions.
func Cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Encode returns the module's binary.
func (m Module) Encode() []byte {
	out := []byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00}
	var types [][]byte
	for _, im := range m.Imports {
		types = append(types, functype(im.Params, im.Results))
	}
	for _, f := range m.Funcs {
		types = append(types, functype(f.Params, f.Results))
	}
	out = append(out, section(1, vec(types))...)
	var imps [][]byte
	for i, im := range m.Imports {
		imps = append(imps, Cat(name(im.Module), name(im.Name), []byte{0x00}, ULEB(uint64(i))))
	}
	out = append(out, section(2, vec(imps))...)
	var fidx [][]byte
	for i := range m.Funcs {
		fidx = append(fidx, ULEB(uint64(len(m.Imports)+i)))
	}
	out = append(out, section(3, vec(fidx))...)
	var exps [][]byte
	if !m.NoMemory {
		out = append(out, section(5, vec([][]byte{Cat([]byte{0x00}, ULEB(uint64(m.MemPages)))}))...)
		exps = append(exps, Cat(name("memory"), []byte{0x02, 0x00}))
	}
	for i, f := range m.Funcs {
		if f.Name != "" {
			exps = append(exps, Cat(name(f.Name), []byte{0x00}, ULEB(uint64(len(m.Imports)+i))))
		}
	}
	out = append(out, section(7, vec(exps))...)
	if m.Start >= 0 {
		out = append(out, section(8, ULEB(uint64(len(m.Imports)+m.Start)))...)
	}
	var codes [][]byte
	for _, f := range m.Funcs {
		// One i32 local after the params, for loop counters.
		body := Cat([]byte{0x01, 0x01, 0x7f}, f.Body, End)
		codes = append(codes, Cat(ULEB(uint64(len(body))), body))
	}
	out = append(out, section(10, vec(codes))...)
	if len(m.Data) > 0 {
		var segs [][]byte
		for off, b := range m.Data {
			segs = append(segs, Cat([]byte{0x00}, I32Const(int32(off)), End, ULEB(uint64(len(b))), b))
		}
		out = append(out, section(11, vec(segs))...)
	}
	return out
}
