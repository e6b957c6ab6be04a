package interrupt

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	wg "github.com/wasmesh/wasmesh/wasm/host/internal/wasmgen"
)

// spin loops forever; sum(n) adds 1..n in a loop; nested(n) runs n x n iterations of two
// nested loops.
func testModule() []byte {
	return wg.Module{
		Funcs: []wg.Func{
			{Name: "spin", Body: wg.Cat(wg.Loop, wg.Br(0), wg.End)},
			{Name: "sum", Params: 1, Results: 1, Body: wg.Cat(
				wg.Block, wg.Loop,
				wg.LocalGet(0), wg.I32Eqz, wg.BrIf(1),
				wg.LocalGet(1), wg.LocalGet(0), wg.I32Add, wg.LocalSet(1),
				wg.LocalGet(0), wg.I32Const(1), wg.I32Sub, wg.LocalSet(0),
				wg.Br(0), wg.End, wg.End,
				wg.LocalGet(1),
			)},
		},
		MemPages: 1,
		Start:    -1,
	}.Encode()
}

func instantiate(t *testing.T, wasm []byte) api.Module {
	t.Helper()
	ctx := context.Background()
	// The runtime the host uses for instrumented modules: no close-on-context-done.
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	mod, err := rt.Instantiate(ctx, wasm)
	require.NoError(t, err)
	return mod
}

func TestInstrumentedModuleComputesTheSame(t *testing.T) {
	ctx := context.Background()
	orig := testModule()
	ins, err := Instrument(orig)
	require.NoError(t, err)
	require.NotEqual(t, orig, ins)
	for _, wasm := range [][]byte{orig, ins} {
		mod := instantiate(t, wasm)
		// Many more iterations than Period, so the countdown wraps many times.
		res, err := mod.ExportedFunction("sum").Call(ctx, 100_000)
		require.NoError(t, err)
		want := uint64(100_000) * 100_001 / 2
		assert.Equal(t, want&0xffffffff, res[0]&0xffffffff)
	}
}

func TestStopFlagEndsARunawayLoop(t *testing.T) {
	ins, err := Instrument(testModule())
	require.NoError(t, err)
	mod := instantiate(t, ins)
	g, ok := mod.ExportedGlobal(GlobalName).(api.MutableGlobal)
	require.True(t, ok, "the stop flag is an exported mutable global")
	assert.Equal(t, uint64(0), g.Get())

	done := make(chan error, 1)
	go func() {
		_, err := mod.ExportedFunction("spin").Call(context.Background())
		done <- err
	}()
	// While the guest spins, stop-the-world collections still complete: the guest passes
	// through Go every Period iterations. Without that, runtime.GC would never return.
	for range 5 {
		runtime.GC()
	}
	select {
	case err := <-done:
		t.Fatalf("the loop ended before the flag was set: %v", err)
	default:
	}
	g.Set(1)
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "unreachable")
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop within 10s of the flag being set")
	}
}

// One check per loop, one counter per function, one global and one export: nothing else
// changes.
func TestEveryLoopGetsACheck(t *testing.T) {
	orig := testModule()
	ins, err := Instrument(orig)
	require.NoError(t, err)
	// The counter follows the params and the one local wasmgen declares.
	spinCheck, sumCheck := check(0, 1), check(0, 2)
	assert.Equal(t, 1, bytes.Count(ins, spinCheck))
	assert.Equal(t, 1, bytes.Count(ins, sumCheck))
	counters := 2 * 2                                    // a (1, i32) local group per function
	globalSection := 2 + len("\x01\x7f\x01\x41\x00\x0b") // id, size, one global
	export := 1 + len(GlobalName) + 2                    // name, kind, index
	assert.Equal(t, len(orig)+len(spinCheck)+len(sumCheck)+counters+globalSection+export, len(ins))
}

func TestRefusals(t *testing.T) {
	_, err := Instrument([]byte("not wasm"))
	assert.ErrorContains(t, err, "not a wasm binary")

	noMem := wg.Module{Funcs: []wg.Func{{Name: "f"}}, NoMemory: true, Start: -1}.Encode()
	_, err = Instrument(noMem)
	assert.ErrorContains(t, err, "no memory")

	taken := wg.Module{Funcs: []wg.Func{{Name: GlobalName}}, MemPages: 1, Start: -1}.Encode()
	_, err = Instrument(taken)
	assert.ErrorContains(t, err, "already exports")

	truncated := testModule()
	_, err = Instrument(truncated[:len(truncated)-3])
	assert.Error(t, err)
}

// Real modules instrument and compile: a filter built with the standard Go toolchain
// (example.wasm; the others come from the same toolchain) and the AssemblyScript fixture.
func TestRealModules(t *testing.T) {
	var paths []string
	for _, dir := range []string{os.Getenv("WASMESH_WASM_DIR"), filepath.Join("..", "..", "..", "..", "build", "wasm")} {
		if dir == "" {
			continue
		}
		m, _ := filepath.Glob(filepath.Join(dir, "example.wasm"))
		paths = append(paths, m...)
		m, _ = filepath.Glob(filepath.Join(dir, "testdata", "*.wasm"))
		paths = append(paths, m...)
	}
	paths = dedupe(paths)
	if len(paths) == 0 {
		t.Skip("no built modules (run make wasm)")
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			wasm, err := os.ReadFile(p)
			require.NoError(t, err)
			ins, err := Instrument(wasm)
			require.NoError(t, err)
			c, err := rt.CompileModule(ctx, ins)
			require.NoError(t, err)
			_, ok := c.ExportedFunctions()["proxy_on_memory_allocate"]
			assert.True(t, ok || len(c.ExportedFunctions()) > 0)
			require.NoError(t, c.Close(ctx))
		})
	}
}

// dedupe drops paths naming a file already listed.
func dedupe(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		if abs, err := filepath.Abs(p); err == nil && !seen[abs] {
			seen[abs] = true
			out = append(out, p)
		}
	}
	return out
}

// Whatever the input, Instrument does not panic, and a module wazero accepts is still
// accepted once instrumented. (Inputs Instrument refuses are not given to wazero, which can
// take seconds on some garbage.)
func FuzzInstrument(f *testing.F) {
	f.Add(testModule())
	f.Add(wg.Module{Funcs: []wg.Func{{Name: "f", Body: wg.Cat(wg.Block, wg.Loop, wg.Loop, wg.Br(2), wg.End, wg.End, wg.End)}},
		MemPages: 1, Start: -1}.Encode())
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	f.Fuzz(func(t *testing.T, wasm []byte) {
		ins, err := Instrument(wasm)
		if err != nil {
			return // refused: the host runs such a module without the check
		}
		c, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return
		}
		_ = c.Close(ctx)
		c, err = rt.CompileModule(ctx, ins)
		if err != nil {
			t.Fatalf("valid module no longer compiles once instrumented: %v", err)
		}
		_ = c.Close(ctx)
	})
}

// Modules wasmgen cannot make: raw sections after the header.
func rawModule(sections ...[]byte) []byte {
	out := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range sections {
		out = append(out, s...)
	}
	return out
}

func rawSection(id byte, body ...byte) []byte {
	return append(append([]byte{id}, wg.ULEB(uint64(len(body)))...), body...)
}

var (
	oneFuncOfType0 = rawSection(secFunction, 1, 0)
	oneMemory      = rawSection(secMemory, 1, 0, 1)
	oneEmptyBody   = rawSection(secCode, 1, 2, 0, opEnd) // no locals, just end
	voidType       = rawSection(secType, 1, 0x60, 0, 0)  // () -> ()
)

// A type that is not a function type (0x60) is refused by its form; a type section that
// ends early is refused as such, not as a type of form 0.
func TestTypeSectionRefusals(t *testing.T) {
	_, err := Instrument(rawModule(rawSection(secType, 1, 0x5f, 0, 0), oneFuncOfType0, oneMemory, oneEmptyBody))
	assert.EqualError(t, err, "type section: unsupported type form 0x5f")

	_, err = Instrument(rawModule(rawSection(secType, 1), oneFuncOfType0, oneMemory, oneEmptyBody))
	assert.EqualError(t, err, "section 1: unexpected end of data")

	// 0x40 is no value type (it is the empty block type), as a parameter or a local.
	_, err = Instrument(rawModule(rawSection(secType, 1, 0x60, 1, 0x40, 0), oneFuncOfType0, oneMemory, oneEmptyBody))
	assert.EqualError(t, err, "section 1: unsupported value type 0x40")
	_, err = Instrument(rawModule(voidType, oneFuncOfType0, oneMemory, rawSection(secCode, 1, 4, 1, 1, 0x40, opEnd)))
	assert.EqualError(t, err, "code section: function body 0: unsupported value type 0x40")
}

// A function whose type index is past the type section is refused, not a panic: index 1
// of a section of one type is the first out of range.
func TestTypeIndexOutOfRange(t *testing.T) {
	wasm := rawModule(voidType, rawSection(secFunction, 1, 1), oneMemory, oneEmptyBody)
	var err error
	require.NotPanics(t, func() { _, err = Instrument(wasm) })
	assert.EqualError(t, err, "code section: function 0: type 1 out of range")
}

// The counter is one more local: a function that already has 2^32-1 locals (the most a
// local index can name, counting from 0, is 2^32-1 locals in all) has no room for it,
// one with a local fewer does.
func TestLocalsAtTheLimit(t *testing.T) {
	body := func(locals uint64) []byte {
		b := append([]byte{1}, wg.ULEB(locals)...) // one group of i32 locals
		b = append(b, valI32, opEnd)
		return rawSection(secCode, append(append([]byte{1}, wg.ULEB(uint64(len(b)))...), b...)...)
	}
	_, err := Instrument(rawModule(voidType, oneFuncOfType0, oneMemory, body(1<<32-1)))
	assert.EqualError(t, err, "code section: function body 0: too many locals")

	ins, err := Instrument(rawModule(voidType, oneFuncOfType0, oneMemory, body(1<<32-2)))
	require.NoError(t, err)
	// Two groups now: the function's and the counter's (1, i32).
	assert.True(t, bytes.Contains(ins, append(append([]byte{2}, wg.ULEB(1<<32-2)...), valI32, 1, valI32, opEnd)))
}

// Functions of several parameters: the parameters are skipped by their count, and the
// counter comes after them and the declared locals.
func TestSeveralParams(t *testing.T) {
	ctx := context.Background()
	// mul(a, b) adds a to itself b times in a loop; local 2 is wasmgen's, the result.
	orig := wg.Module{Funcs: []wg.Func{{Name: "mul", Params: 2, Results: 1, Body: wg.Cat(
		wg.Block, wg.Loop,
		wg.LocalGet(1), wg.I32Eqz, wg.BrIf(1),
		wg.LocalGet(2), wg.LocalGet(0), wg.I32Add, wg.LocalSet(2),
		wg.LocalGet(1), wg.I32Const(1), wg.I32Sub, wg.LocalSet(1),
		wg.Br(0), wg.End, wg.End,
		wg.LocalGet(2),
	)}}, MemPages: 1, Start: -1}.Encode()
	ins, err := Instrument(orig)
	require.NoError(t, err)
	assert.Equal(t, 1, bytes.Count(ins, check(0, 3)))
	res, err := instantiate(t, ins).ExportedFunction("mul").Call(ctx, 7, 5000)
	require.NoError(t, err)
	assert.Equal(t, uint64(35000), res[0]&0xffffffff)
}

// A module may import its memory and globals: the memory is the one the check passes
// through, and the stop flag comes after the imported globals in the global index space.
func TestImportedMemoryAndGlobal(t *testing.T) {
	ctx := context.Background()
	name := func(s string) []byte { return append(wg.ULEB(uint64(len(s))), s...) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	// env exports a memory and an immutable i32 global of 7.
	env := rawModule(
		oneMemory,
		rawSection(secGlobal, 1, valI32, 0, opI32Const, 7, opEnd),
		rawSection(secExport, cat([]byte{2}, name("memory"), []byte{kindMemory, 0}, name("g"), []byte{kindGlobal, 0})...),
	)
	// spin imports both and loops forever.
	spin := rawModule(
		voidType,
		rawSection(secImport, cat([]byte{2}, name("env"), name("memory"), []byte{kindMemory, 0, 1},
			name("env"), name("g"), []byte{kindGlobal, valI32, 0})...),
		oneFuncOfType0,
		rawSection(secExport, cat([]byte{1}, name("spin"), []byte{kindFunc, 0})...),
		rawSection(secCode, 1, 7, 0, opLoop, blockEmpty, 0x0c, 0, opEnd, opEnd), // loop br 0 end
	)
	ins, err := Instrument(spin)
	require.NoError(t, err)

	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { _ = rt.Close(ctx) })
	_, err = rt.InstantiateWithConfig(ctx, env, wazero.NewModuleConfig().WithName("env"))
	require.NoError(t, err)
	mod, err := rt.Instantiate(ctx, ins)
	require.NoError(t, err)
	flag, ok := mod.ExportedGlobal(GlobalName).(api.MutableGlobal)
	require.True(t, ok, "the stop flag is the module's own mutable global")
	flag.Set(1)
	_, err = mod.ExportedFunction("spin").Call(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unreachable")
}
