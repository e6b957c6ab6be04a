package interrupt

import (
	"errors"
	"fmt"
)

var errShort = errors.New("unexpected end of data")

// reader decodes the parts of the binary format the instrumentation walks. The first
// error sticks; later reads return zero values.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) done() bool { return r.err != nil || r.off >= len(r.b) }

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.fail(errShort)
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.fail(errShort)
		return nil
	}
	out := r.b[r.off : r.off+n]
	r.off += n
	return out
}

// leb reads an unsigned or signed LEB128 of at most maxBytes bytes, returning the raw
// unsigned value (only u32 values are used; the rest are skipped).
func (r *reader) leb(maxBytes int) uint64 {
	var v uint64
	for i := 0; i < maxBytes; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		if i < 10 {
			v |= uint64(c&0x7f) << (7 * i)
		}
		if c&0x80 == 0 {
			return v
		}
	}
	r.fail(errors.New("LEB128 too long"))
	return 0
}

func (r *reader) u32() uint32 { return uint32(r.leb(5)) }
func (r *reader) s33()        { r.leb(5) }
func (r *reader) u64()        { r.leb(10) }

func (r *reader) name() []byte {
	n := r.u32()
	return r.bytes(int(n))
}

// limits skips table or memory limits: flags (bit 0 max present, bit 1 shared, bit 2
// 64-bit) and the bounds.
func (r *reader) limits() {
	flags := r.byte()
	if flags > 7 {
		r.fail(fmt.Errorf("unknown limits flags %#x", flags))
		return
	}
	r.u64()
	if flags&1 != 0 {
		r.u64()
	}
}

// valtype skips a value type: the numeric, vector and reference types wazero accepts.
func (r *reader) valtype() {
	switch t := r.byte(); t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f, 0x69:
	default:
		if r.err == nil {
			r.fail(fmt.Errorf("unsupported value type %#x", t))
		}
	}
}

func (r *reader) memarg() {
	align := r.u32()
	if align&0x40 != 0 { // multi-memory: a memory index follows
		r.u32()
	}
	r.u64()
}

// immediates skips the immediates of the instruction whose opcode was just read. It
// covers the core instruction set and the extensions wazero implements: sign extension,
// saturating conversions, bulk memory, reference types, multi-value, SIMD, threads, tail
// calls and exception handling (both encodings).
func (r *reader) immediates(op byte) error {
	switch {
	case op == 0x00 || op == 0x01 || op == 0x05 || op == 0x0a || op == 0x0b || op == 0x0f ||
		op == 0x19 || op == 0x1a || op == 0x1b || op == 0xd1 || op == 0xd3 || op == 0xd4:
		// unreachable nop else throw_ref end return catch_all drop select ref.is_null
		// ref.eq ref.as_non_null
	case op == 0x02 || op == 0x03 || op == 0x04 || op == 0x06: // block loop if try
		r.s33()
	case op == 0x07 || op == 0x08 || op == 0x09 || op == 0x18 || op == 0x0c || op == 0x0d ||
		op == 0x10 || op == 0x12 || op == 0x14 || op == 0x15 || op == 0xd2 || op == 0xd5 || op == 0xd6:
		// catch throw rethrow delegate br br_if call return_call call_ref return_call_ref
		// ref.func br_on_null br_on_non_null: one index
		r.u32()
	case op == 0x0e: // br_table
		for n := r.u32(); n > 0 && r.err == nil; n-- {
			r.u32()
		}
		r.u32()
	case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect
		r.u32()
		r.u32()
	case op == 0x1c: // select t*
		for n := r.u32(); n > 0 && r.err == nil; n-- {
			r.valtype()
		}
	case op == 0x1f: // try_table
		r.s33()
		for n := r.u32(); n > 0 && r.err == nil; n-- {
			switch kind := r.byte(); kind {
			case 0, 1: // catch, catch_ref: tag, label
				r.u32()
				r.u32()
			case 2, 3: // catch_all, catch_all_ref: label
				r.u32()
			default:
				return fmt.Errorf("unknown catch kind %#x", kind)
			}
		}
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		r.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores
		r.memarg()
	case op == 0x3f || op == 0x40: // memory.size, memory.grow
		r.u32()
	case op == 0x41: // i32.const
		r.leb(5)
	case op == 0x42: // i64.const
		r.leb(10)
	case op == 0x43:
		r.bytes(4)
	case op == 0x44:
		r.bytes(8)
	case op >= 0x45 && op <= 0xc4: // numeric, sign extension
	case op == 0xd0: // ref.null heaptype
		r.s33()
	case op == 0xfc:
		return r.prefixFC()
	case op == 0xfd:
		return r.prefixFD()
	case op == 0xfe:
		return r.prefixFE()
	default:
		return fmt.Errorf("unknown opcode %#x", op)
	}
	return nil
}

func (r *reader) prefixFC() error {
	switch sub := r.u32(); {
	case sub <= 7: // saturating conversions
	case sub == 8: // memory.init data, memory
		r.u32()
		r.u32()
	case sub == 9 || sub == 11 || sub == 13 || sub == 15 || sub == 16 || sub == 17:
		// data.drop memory.fill elem.drop table.grow table.size table.fill
		r.u32()
	case sub == 10 || sub == 12 || sub == 14: // memory.copy table.init table.copy
		r.u32()
		r.u32()
	default:
		return fmt.Errorf("unknown opcode 0xfc %d", sub)
	}
	return nil
}

func (r *reader) prefixFD() error {
	switch sub := r.u32(); {
	case sub <= 11 || sub == 92 || sub == 93: // v128 loads and stores, load32/64_zero
		r.memarg()
	case sub == 12 || sub == 13: // v128.const, i8x16.shuffle
		r.bytes(16)
	case sub >= 21 && sub <= 34: // extract_lane, replace_lane
		r.byte()
	case sub >= 84 && sub <= 91: // load_lane, store_lane
		r.memarg()
		r.byte()
	case sub <= 275: // everything else takes no immediate
	default:
		return fmt.Errorf("unknown opcode 0xfd %d", sub)
	}
	return nil
}

func (r *reader) prefixFE() error {
	switch sub := r.u32(); {
	case sub == 3: // atomic.fence
		r.byte()
	case sub <= 0x4e:
		r.memarg()
	default:
		return fmt.Errorf("unknown opcode 0xfe %d", sub)
	}
	return nil
}
