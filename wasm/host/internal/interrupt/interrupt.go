// Package interrupt makes a wasm module stoppable from outside while it runs, without
// help from the engine. It adds a mutable i32 global, the stop flag, exported as
// GlobalName, a counter local to every function, and code at the top of every loop: the
// counter is incremented, and every Period iterations the guest passes through the host
// (a memory.grow by zero pages, which wazero runs in Go) and traps (unreachable) if the
// stop flag is set.
//
// wazero can stop a guest itself (RuntimeConfig.WithCloseOnContextDone), but it pays for
// that on every call into the guest, nested ones included (a goroutine and a channel per
// call), and it leaves the machine code for Go at every loop iteration. For a guest built
// with the standard Go toolchain, whose every function is a loop, that was three quarters
// of the time of a small filter. Here a loop iteration costs an add, an and and a branch
// on a local, which the engine keeps in a register.
//
// The periodic trip through Go matters as much as the flag: machine code cannot be
// preempted by the Go scheduler, so a guest that never left it would hold up every
// stop-the-world garbage collection in the process, and with it the very goroutine that
// is to set the flag. Every Period iterations of any one loop the guest's goroutine runs
// Go code, where a pending preemption takes effect.
//
// A runaway computation either iterates some loop forever, which then passes the check
// every Period iterations, or recurses without end and overflows the stack; straight-line
// code always ends. The counter is per function call, so a loop is checked however many
// other functions it calls.
package interrupt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// GlobalName is the export name of the stop flag.
const GlobalName = "wasmesh_interrupt"

// Period is the number of iterations of a loop between two trips through the host; a
// power of two, so the check is a mask.
const Period = 1024

// Section ids and the opcodes the inserted code uses.
const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secMemory   = 5
	secGlobal   = 6
	secExport   = 7
	secCode     = 10
	secDataCnt  = 12
	secTag      = 13

	kindFunc   = 0
	kindMemory = 2
	kindGlobal = 3

	valI32     = 0x7f
	blockEmpty = 0x40

	opUnreach   = 0x00
	opLoop      = 0x03
	opIf        = 0x04
	opEnd       = 0x0b
	opDrop      = 0x1a
	opLocalGet  = 0x20
	opLocalTee  = 0x22
	opGlobalGet = 0x23
	opMemGrow   = 0x40
	opI32Const  = 0x41
	opI32Eqz    = 0x45
	opI32Add    = 0x6a
	opI32And    = 0x71
)

// order ranks the known sections in the order the spec requires (custom sections may go
// anywhere and have no rank).
func order(id byte) int {
	switch id {
	case secType, secImport, secFunction, 4, secMemory: // 4: table
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

type section struct {
	id   byte
	body []byte
}

// module is what the instrumentation needs to know about the input.
type module struct {
	secs            []section
	params          []uint32 // parameter count per type
	funcTypes       []uint32 // type index per defined function
	importedGlobals uint32
	definedGlobals  uint32
	memories        int
}

// Instrument returns a copy of the module with the stop flag, the counters and the loop
// checks. It fails on bytes it cannot decode (the engine will say what is wrong with
// them), on a module without a memory, and on a module that already exports GlobalName.
func Instrument(wasm []byte) ([]byte, error) {
	m, err := parse(wasm)
	if err != nil {
		return nil, err
	}
	if m.memories == 0 {
		return nil, errors.New("the module has no memory to pass through the host with")
	}
	stop := m.importedGlobals + m.definedGlobals

	out := append([]byte(nil), wasm[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
	}
	newGlobal := []byte{valI32, 1, opI32Const, 0, opEnd} // mutable i32 = 0
	newExport := append(name(GlobalName), kindGlobal)
	newExport = binary.AppendUvarint(newExport, uint64(stop))
	haveGlobal, haveExport := false, false
	for _, s := range m.secs {
		rank := order(s.id)
		if rank > order(secGlobal) && !haveGlobal {
			emit(secGlobal, append([]byte{1}, newGlobal...))
			haveGlobal = true
		}
		if rank > order(secExport) && !haveExport {
			emit(secExport, append([]byte{1}, newExport...))
			haveExport = true
		}
		switch s.id {
		case secGlobal:
			emit(secGlobal, appendToVec(s.body, newGlobal))
			haveGlobal = true
		case secExport:
			if err := checkExports(s.body); err != nil {
				return nil, fmt.Errorf("export section: %w", err)
			}
			emit(secExport, appendToVec(s.body, newExport))
			haveExport = true
		case secCode:
			body, err := m.instrumentCode(s.body, stop)
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
		emit(secGlobal, append([]byte{1}, newGlobal...))
	}
	if !haveExport {
		emit(secExport, append([]byte{1}, newExport...))
	}
	return out, nil
}

func parse(wasm []byte) (*module, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) || binary.LittleEndian.Uint32(wasm[4:8]) != 1 {
		return nil, errors.New("not a wasm binary module (version 1)")
	}
	m := &module{}
	r := &reader{b: wasm, off: 8}
	for !r.done() {
		id := r.byte()
		n := r.u32()
		body := r.bytes(int(n))
		if r.err != nil {
			return nil, fmt.Errorf("section at offset %d: %w", r.off, r.err)
		}
		m.secs = append(m.secs, section{id, body})
	}
	for _, s := range m.secs {
		sr := &reader{b: s.body}
		switch s.id {
		case secType:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				if form := sr.byte(); form != 0x60 && sr.err == nil {
					return nil, fmt.Errorf("type section: unsupported type form %#x", form)
				}
				params := sr.u32()
				for i := uint32(0); i < params && sr.err == nil; i++ {
					sr.valtype()
				}
				for results := sr.u32(); results > 0 && sr.err == nil; results-- {
					sr.valtype()
				}
				m.params = append(m.params, params)
			}
		case secImport:
			m.importedGlobals, m.memories = sr.imports()
		case secFunction:
			for n := sr.u32(); n > 0 && sr.err == nil; n-- {
				m.funcTypes = append(m.funcTypes, sr.u32())
			}
		case secGlobal:
			m.definedGlobals = sr.u32()
		case secMemory:
			m.memories += int(sr.u32())
		default:
			continue
		}
		if sr.err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, sr.err)
		}
	}
	return m, nil
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

// appendToVec adds one encoded item to a section that is a single vector.
func appendToVec(body, item []byte) []byte {
	r := &reader{b: body}
	have := r.u32()
	out := binary.AppendUvarint(nil, uint64(have)+1)
	out = append(out, body[r.off:]...)
	return append(out, item...)
}

// imports returns the number of imported globals and memories.
func (r *reader) imports() (globals uint32, memories int) {
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.name()
		r.name()
		switch kind := r.byte(); kind {
		case kindFunc: // type index
			r.u32()
		case 1: // table: reftype, limits
			r.byte()
			r.limits()
		case kindMemory:
			r.limits()
			memories++
		case kindGlobal: // valtype, mutability
			r.valtype()
			r.byte()
			globals++
		case 4: // tag: attribute, type index
			r.byte()
			r.u32()
		default:
			r.fail(fmt.Errorf("unknown import kind %#x", kind))
		}
	}
	return globals, memories
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
//	local.get $n  i32.const 1  i32.add  local.tee $n
//	i32.const Period-1  i32.and  i32.eqz
//	if
//	  i32.const 0  memory.grow 0  drop     ;; through the host: a preemption point
//	  global.get $stop
//	  if  unreachable  end
//	end
func check(stop, counter uint32) []byte {
	c := binary.AppendUvarint([]byte{opLocalGet}, uint64(counter))
	c = append(c, opI32Const, 1, opI32Add, opLocalTee)
	c = binary.AppendUvarint(c, uint64(counter))
	c = append(c, opI32Const)
	c = appendSLEB(c, Period-1)
	c = append(c, opI32And, opI32Eqz, opIf, blockEmpty, opI32Const, 0, opMemGrow, 0, opDrop, opGlobalGet)
	c = binary.AppendUvarint(c, uint64(stop))
	return append(c, opIf, blockEmpty, opUnreach, opEnd, opEnd)
}

func (m *module) instrumentCode(body []byte, stop uint32) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	if r.err == nil && int(n) != len(m.funcTypes) {
		return nil, fmt.Errorf("%d function bodies for %d functions", n, len(m.funcTypes))
	}
	out := binary.AppendUvarint(nil, uint64(n))
	var fn []byte
	for i := uint32(0); i < n && r.err == nil; i++ {
		size := r.u32()
		code := r.bytes(int(size))
		if r.err != nil {
			break
		}
		t := m.funcTypes[i]
		if int(t) >= len(m.params) {
			return nil, fmt.Errorf("function %d: type %d out of range", i, t)
		}
		var err error
		fn, err = instrumentFunc(fn[:0], code, m.params[t], stop)
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

// instrumentFunc copies one function body to out with one more i32 local, the loop
// counter, and the check after every loop header.
func instrumentFunc(out, code []byte, params, stop uint32) ([]byte, error) {
	r := &reader{b: code}
	groups := r.u32()
	declStart := r.off
	locals := uint64(params)
	for g := groups; g > 0 && r.err == nil; g-- {
		locals += uint64(r.u32())
		r.valtype()
	}
	if r.err != nil {
		return nil, r.err
	}
	if locals >= 1<<32-1 {
		return nil, errors.New("too many locals")
	}
	chk := check(stop, uint32(locals))
	out = binary.AppendUvarint(out, uint64(groups)+1)
	out = append(out, code[declStart:r.off]...)
	out = append(out, 1, valI32)
	last := r.off
	for !r.done() {
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
