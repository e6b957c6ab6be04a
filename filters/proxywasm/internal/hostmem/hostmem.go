// Package hostmem keeps the memory the host allocates inside the guest (through
// proxy_on_memory_allocate) reachable for the Go garbage collector until the guest has
// taken it over.
//
// The host answers a call such as proxy_get_header_map_pairs by asking the guest for a
// buffer, filling it, and writing the buffer's address into a u32 the guest passed in.
// Between the allocation and the moment the guest reads that u32, the only reference to
// the buffer is a 32-bit integer in linear memory, which the GC does not treat as a
// pointer: a collection triggered in between (by another allocation in the same host call)
// would free the buffer under the host's feet. The table holds a real reference from the
// allocation until Take hands the buffer to the guest code that asked for it.
//
// The table is plain Go so it can be tested natively; the wasip1 ABI layer owns the one
// instance.
package hostmem

import "unsafe"

// Table holds buffers allocated for the host, in allocation order. It is not safe for
// concurrent use; a wasm guest has a single thread.
type Table struct {
	// Entries stay in allocation order (Take removes without reordering), so those
	// allocated during a host call are always at the tail: ReleaseSince only pops.
	entries []entry
	seq     uint64
}

type entry struct {
	addr uintptr
	seq  uint64
	buf  []byte
}

// Alloc returns a new zeroed buffer of size bytes and its address, and keeps it alive
// until Take or a release. A zero size still gets a distinct one-byte buffer: address 0
// means failure to the host, and Go gives every empty allocation the same address.
func (t *Table) Alloc(size uint32) (buf []byte, addr uintptr) {
	n := int(size)
	if n == 0 {
		n = 1
	}
	buf = make([]byte, n)
	addr = uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	t.seq++
	t.entries = append(t.entries, entry{addr: addr, seq: t.seq, buf: buf})
	return buf[:size], addr
}

// Mark returns a position to pass to ReleaseSince once the host call that may allocate
// has returned.
func (t *Table) Mark() uint64 { return t.seq }

// Take hands the buffer at addr over to the caller and forgets it. It reports false when
// addr was not allocated through the table (or was already taken) or when size exceeds
// the allocation: the host is broken and the memory must not be read.
func (t *Table) Take(addr uintptr, size uint32) ([]byte, bool) {
	for i := len(t.entries) - 1; i >= 0; i-- {
		e := t.entries[i]
		if e.addr != addr {
			continue
		}
		if int(size) > len(e.buf) {
			return nil, false
		}
		copy(t.entries[i:], t.entries[i+1:])
		t.entries[len(t.entries)-1] = entry{}
		t.entries = t.entries[:len(t.entries)-1]
		return e.buf[:size:size], true
	}
	return nil, false
}

// ReleaseSince drops the buffers allocated after mark that nobody took: the host
// allocated them during a call that has now returned (for example it allocated and then
// failed), so no one will ever read them. Host calls nest strictly, so everything a
// nested call left behind is released by the time its caller gets here.
func (t *Table) ReleaseSince(mark uint64) {
	for len(t.entries) > 0 && t.entries[len(t.entries)-1].seq > mark {
		t.entries[len(t.entries)-1] = entry{}
		t.entries = t.entries[:len(t.entries)-1]
	}
}

// Reset drops every buffer. The ABI layer calls it when the outermost callback returns
// to the host: no guest call is in progress then, so nothing can still be waiting for a
// buffer.
func (t *Table) Reset() {
	clear(t.entries)
	t.entries = t.entries[:0]
}

// Len reports how many buffers are held.
func (t *Table) Len() int { return len(t.entries) }
