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
