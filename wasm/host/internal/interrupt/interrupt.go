// Package interrupt makes a wasm module stoppable from outside while it runs, without
// help from the engine. It adds two mutable i32 globals, a stop flag exported as
// GlobalName and a private countdown, and code at the top of every loop: the countdown
// is decremented, and every Period loop iterations the guest passes through the host
// (a memory.grow by zero pages, which wazero runs in Go) and traps (unreachable) if the
// stop flag is set.
//
// wazero can stop a guest itself (RuntimeConfig.WithCloseOnContextDone), but it pays for
// that on every call into the guest, nested ones included (a goroutine and a channel per
// call), and it leaves the machine code for Go at every loop iteration. For a guest built
// with the standard Go toolchain, whose every function is a loop, that was three quarters
// of the time of a small filter. Here a loop iteration costs a decrement and a branch.
//
// The periodic trip through Go matters as much as the flag: machine code cannot be
// preempted by the Go scheduler, so a guest that never left it would hold up every
// stop-the-world garbage collection in the process, and with it the very goroutine that
// is to set the flag. Every Period iterations the guest's goroutine runs Go code, where
// a pending preemption takes effect.
//
// Every loop header is covered, as in wazero's own check, so a runaway loop stops within
// Period iterations once the flag is set; straight-line code always ends, and unbounded
// recursion overflows the stack.
package interrupt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// GlobalName is the export name of the stop flag.
const GlobalName = "wasmesh_interrupt"

// Period is the number of loop iterations between two trips through the host.
const Period = 1000

// Section ids.
const (
	secCustom   = 0
	secImport   = 2
	secGlobal   = 6
	secExport   = 7
	secCode     = 10
	secTag      = 13
	secDataCnt  = 12
	kindGlobal  = 3
	opLoop      = 0x03
	valI32      = 0x7f
	opGlobalGet = 0x23
	opIf        = 0x04
	blockEmpty  = 0x40
	opUnreach   = 0x00
	opEnd       = 0x0b
	opGlobalSet = 0x24
	opI32Const  = 0x41
	opI32Sub    = 0x6b
	opI32Eqz    = 0x45
	opMemGrow   = 0x40
	opDrop      = 0x1a
	secMemory   = 5
	kindMemory  = 2
)

// order ranks the known sections in the order the spec requires (custom sections may go
// anywhere and have no rank).
func order(id byte) int {
	switch id {
	case 1, 2, 3, 4, 5: // type, import, function, table, memory
		return int(id)
	case secTag:
		return 6
	case secGlobal:
		return 7
	case secExport:
		return 8
	case 8, 9: // start, element
		return int(id) + 1
	case secDataCnt:
		return 11
	case secCode:
		return 12
	case 11: // data
		return 13
	}
	return 0
}

// Instrument returns a copy of the module with the interrupt global and the loop checks.
// It fails on bytes that are not a module it can decode (a later engine error would be no
// clearer), and on a module that already exports GlobalName.
func Instrument(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) || binary.LittleEndian.Uint32(wasm[4:8]) != 1 {
		return nil, errors.New("not a wasm binary module (version 1)")
	}
	type section struct {
		id   byte
		body []byte
	}
	var secs []section
	r := &reader{b: wasm, off: 8}
	for !r.done() {
		id := r.byte()
		n := r.u32()
		body := r.bytes(int(n))
		if r.err != nil {
			return nil, fmt.Errorf("section at offset %d: %w", r.off, r.err)
		}
		secs = append(secs, section{id, body})
	}

	importedGlobals, definedGlobals, memories := 0, 0, 0
	for _, s := range secs {
		switch s.id {
		case secImport:
			g, m, err := countImports(s.body)
			if err != nil {
				return nil, fmt.Errorf("import section: %w", err)
			}
			importedGlobals, memories = g, memories+m
		case secGlobal:
			sr := &reader{b: s.body}
			definedGlobals = int(sr.u32())
			if sr.err != nil {
				return nil, fmt.Errorf("global section: %w", sr.err)
			}
		case secMemory:
			sr := &reader{b: s.body}
			memories += int(sr.u32())
			if sr.err != nil {
				return nil, fmt.Errorf("memory section: %w", sr.err)
			}
		}
	}
	if memories == 0 {
		return nil, errors.New("the module has no memory to pass through the host with")
	}
	stop := uint32(importedGlobals + definedGlobals)
	countdown := stop + 1

	out := append([]byte(nil), wasm[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
	}
	// Two mutable i32 globals: the stop flag (0) and the countdown (Period).
	newGlobals := []byte{valI32, 1, opI32Const, 0, opEnd, valI32, 1, opI32Const}
	newGlobals = appendSLEB(newGlobals, Period)
	newGlobals = append(newGlobals, opEnd)
	newExport := append(name(GlobalName), kindGlobal)
	newExport = binary.AppendUvarint(newExport, uint64(stop))
	haveGlobal, haveExport := false, false
	for _, s := range secs {
		rank := order(s.id)
		if rank > order(secGlobal) && !haveGlobal {
			emit(secGlobal, append([]byte{2}, newGlobals...))
			haveGlobal = true
		}
		if rank > order(secExport) && !haveExport {
			emit(secExport, append([]byte{1}, newExport...))
			haveExport = true
		}
		switch s.id {
		case secGlobal:
			emit(secGlobal, appendToVec(s.body, 2, newGlobals))
			haveGlobal = true
		case secExport:
			if err := checkExports(s.body); err != nil {
				return nil, fmt.Errorf("export section: %w", err)
			}
			emit(secExport, appendToVec(s.body, 1, newExport))
			haveExport = true
		case secCode:
			body, err := instrumentCode(s.body, check(stop, countdown))
			if err != nil {
				return nil, fmt.Errorf("code section: %w", err)
			}
			emit(secCode, body)
		case secCustom:
			// DWARF describes code offsets, which the checks move: drop it rather than
			// have trap stack traces point at wrong source lines.
			if nr := (&reader{b: s.body}); bytes.HasPrefix(nr.name(), []byte(".debug_")) {
				continue
			}
			emit(s.id, s.body)
		default:
			emit(s.id, s.body)
		}
	}
	if !haveGlobal {
		emit(secGlobal, append([]byte{2}, newGlobals...))
	}
	if !haveExport {
		emit(secExport, append([]byte{1}, newExport...))
	}
	return out, nil
}

// appendSLEB appends v as a signed LEB128 (i32.const's immediate).
func appendSLEB(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func name(s string) []byte { return append(binary.AppendUvarint(nil, uint64(len(s))), s...) }

// appendToVec adds n encoded items to a section that is a single vector.
func appendToVec(body []byte, n uint32, items []byte) []byte {
	r := &reader{b: body}
	have := r.u32()
	out := binary.AppendUvarint(nil, uint64(have)+uint64(n))
	out = append(out, body[r.off:]...)
	return append(out, items...)
}

// countImports returns the number of imported globals and memories.
func countImports(body []byte) (globals, memories int, err error) {
	r := &reader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.name()
		r.name()
		switch kind := r.byte(); kind {
		case 0: // function: type index
			r.u32()
		case 1: // table: reftype, limits
			r.byte()
			r.limits()
		case kindMemory:
			r.limits()
			memories++
		case kindGlobal: // valtype, mutability
			r.byte()
			r.byte()
			globals++
		case 4: // tag: attribute, type index
			r.byte()
			r.u32()
		default:
			return 0, 0, fmt.Errorf("unknown import kind %#x", kind)
		}
	}
	return globals, memories, r.err
}

func checkExports(body []byte) error {
	r := &reader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		if string(r.name()) == GlobalName {
			return fmt.Errorf("module already exports %q", GlobalName)
		}
		r.byte()
		r.u32()
	}
	return r.err
}

// check is the code inserted after every loop's block type:
//
//	global.get $countdown  i32.const 1  i32.sub  global.set $countdown
//	global.get $countdown  i32.eqz
//	if
//	  i32.const Period  global.set $countdown
//	  i32.const 0  memory.grow 0  drop     ;; through the host: a preemption point
//	  global.get $stop
//	  if  unreachable  end
//	end
func check(stop, countdown uint32) []byte {
	get := func(c []byte, g uint32) []byte { return binary.AppendUvarint(append(c, opGlobalGet), uint64(g)) }
	set := func(c []byte, g uint32) []byte { return binary.AppendUvarint(append(c, opGlobalSet), uint64(g)) }
	c := get(nil, countdown)
	c = append(c, opI32Const, 1, opI32Sub)
	c = set(c, countdown)
	c = get(c, countdown)
	c = append(c, opI32Eqz, opIf, blockEmpty, opI32Const)
	c = appendSLEB(c, Period)
	c = set(c, countdown)
	c = append(c, opI32Const, 0, opMemGrow, 0, opDrop)
	c = get(c, stop)
	return append(c, opIf, blockEmpty, opUnreach, opEnd, opEnd)
}

func instrumentCode(body, chk []byte) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := binary.AppendUvarint(nil, uint64(n))
	var fn []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		size := r.u32()
		code := r.bytes(int(size))
		if r.err != nil {
			break
		}
		var err error
		fn, err = instrumentFunc(fn[:0], code, chk)
		if err != nil {
			return nil, fmt.Errorf("function body %d: %w", i, err)
		}
		out = binary.AppendUvarint(out, uint64(len(fn)))
		out = append(out, fn...)
	}
	if r.err == nil && !r.done() {
		r.err = errors.New("trailing bytes")
	}
	return out, r.err
}

// instrumentFunc copies one function body (locals and instructions) to out, adding chk
// after every loop header.
func instrumentFunc(out, code, chk []byte) ([]byte, error) {
	r := &reader{b: code}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.u32()
		r.valtype()
	}
	last := 0
	for !r.done() && r.err == nil {
		at := r.off
		op := r.byte()
		if err := r.immediates(op); err != nil {
			return nil, fmt.Errorf("instruction at body offset %d: %w", at, err)
		}
		if op == opLoop && r.err == nil {
			out = append(out, code[last:r.off]...)
			out = append(out, chk...)
			last = r.off
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return append(out, code[last:]...), nil
}
