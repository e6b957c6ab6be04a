package hostmem

import "unsafe"

// Arena hands out the memory for host call results without the garbage collector: one
// buffer allocated once, used as a stack. A host call's results are allocated on top
// (Alloc), read or copied by the guest code that made the call, and released together
// (Release back to the Mark taken before the call), so the arena never holds more than the
// results of the calls in progress. Memory is handed out 8-byte aligned, so result slots
// can live there too.
//
// Results that do not fit fall back to the Table, which allocates on the Go heap and keeps
// the buffer reachable until it is taken.
type Arena struct {
	buf  []byte
	base uintptr // address of buf[0]
	off  int
	// Overflow holds what did not fit.
	Overflow Table
}

// NewArena returns an arena of size bytes.
func NewArena(size int) *Arena {
	buf := make([]byte, size)
	return &Arena{buf: buf, base: uintptr(unsafe.Pointer(unsafe.SliceData(buf)))}
}

// ArenaMark is a position to release back to.
type ArenaMark struct {
	off   int
	table uint64
}

// Mark returns the current position.
func (a *Arena) Mark() ArenaMark { return ArenaMark{off: a.off, table: a.Overflow.Mark()} }

// Release frees everything allocated since m.
func (a *Arena) Release(m ArenaMark) {
	a.off = m.off
	if len(a.Overflow.entries) > 0 { // rare: checked here so the common case is inlined
		a.Overflow.ReleaseSince(m.table)
	}
}

// Reset frees everything: no host call is in progress.
func (a *Arena) Reset() {
	a.off = 0
	a.Overflow.Reset()
}

// Alloc returns the address of size bytes for the host to fill. A zero size still gets a
// distinct address (0 means failure to the host).
func (a *Arena) Alloc(size uint32) uintptr {
	n := (max(int(size), 1) + 7) &^ 7
	if n <= len(a.buf)-a.off {
		p := uintptr(unsafe.Pointer(&a.buf[a.off]))
		a.off += n
		return p
	}
	_, addr := a.Overflow.Alloc(size)
	return addr
}

// Slots returns n zeroed u32 result slots on the arena (for the pointer, size or CAS a
// host call writes back), valid until the next Release below them.
func (a *Arena) Slots(n int) []uint32 {
	size := 4 * n
	if size > len(a.buf)-a.off {
		return make([]uint32, n) // on the heap: as good, only slower
	}
	s := unsafe.Slice((*uint32)(unsafe.Pointer(&a.buf[a.off])), n)
	a.off += (size + 7) &^ 7
	clear(s)
	return s
}

// Scratch returns n bytes for an argument of a host call, on the arena when they fit and
// on the heap otherwise (the caller's reference keeps those alive).
func (a *Arena) Scratch(n int) []byte {
	if n > len(a.buf)-a.off {
		return make([]byte, n)
	}
	b := a.buf[a.off : a.off+n : a.off+n]
	a.off += (n + 7) &^ 7
	return b
}

// View returns the size bytes at addr, which the host filled after an Alloc: a view into
// the arena valid until the Release that frees it, or the buffer taken over from the
// overflow table. It reports false for memory not allocated here or a size beyond the
// allocation: the host is broken and the memory must not be read.
func (a *Arena) View(addr uintptr, size uint32) ([]byte, bool) {
	// Small enough to be inlined: it runs on every host call that returns data.
	if start, end := addr-a.base, addr-a.base+uintptr(size); addr >= a.base && end <= uintptr(a.off) && start < end {
		return a.buf[start:end:end], true
	}
	return a.viewSlow(addr, size)
}

func (a *Arena) viewSlow(addr uintptr, size uint32) ([]byte, bool) {
	if start := addr - a.base; addr >= a.base && start < uintptr(a.off) {
		if size == 0 {
			return a.buf[start:start:start], true
		}
		return nil, false // past the allocation
	}
	return a.Overflow.Take(addr, size)
}

// InUse reports how many arena bytes are allocated.
func (a *Arena) InUse() int { return a.off }
