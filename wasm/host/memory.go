package host

import (
	"context"
	"encoding/binary"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
)

// limitedMemory backs one VM instance's linear memory and enforces the plugin's memory
// limit. wazero's own limit (RuntimeConfig.WithMemoryLimitPages) is a property of the whole
// runtime, which the host shares between plugins to compile each module once; installing
// an allocator per instantiation (experimental.WithMemoryAllocator) gives every plugin its
// own limit. A refused growth makes memory.grow return -1, which the guest's allocator
// turns into its out-of-memory path; refused records that so the failure can be
// classified as FailureMemory rather than a plain trap or exit.
type limitedMemory struct {
	limit   uint64
	buf     []byte
	refused bool
}

func newLimitedMemory(limit uint64) *limitedMemory { return &limitedMemory{limit: limit} }

// Allocate implements experimental.MemoryAllocator; each instantiation gets its own
// limitedMemory, so it hands out itself.
func (m *limitedMemory) Allocate(capacity, maximum uint64) experimental.LinearMemory {
	if maximum < m.limit {
		m.limit = maximum
	}
	if capacity > m.limit {
		capacity = m.limit
	}
	m.buf = make([]byte, 0, capacity)
	return m
}

// Reallocate implements experimental.LinearMemory. Growing within the capacity reuses the
// backing array, whose unused tail is still zero as wasm requires of new pages.
func (m *limitedMemory) Reallocate(size uint64) []byte {
	if size > m.limit {
		m.refused = true
		return nil
	}
	if size <= uint64(cap(m.buf)) {
		m.buf = m.buf[:size]
		return m.buf
	}
	newCap := 2 * uint64(cap(m.buf))
	if newCap < size {
		newCap = size
	}
	if newCap > m.limit {
		newCap = m.limit
	}
	nb := make([]byte, size, newCap)
	copy(nb, m.buf)
	m.buf = nb
	return nb
}

// Free implements experimental.LinearMemory.
func (m *limitedMemory) Free() { m.buf = nil }

// guestAbort is raised (as a panic) by a host function whose nested call into the guest
// failed — typically the guest's allocator trapping or exiting. The guest's runtime is in an
// unknown state from then on, so the outer guest call must be aborted rather than resumed.
type guestAbort struct{ err error }

func (g *guestAbort) Error() string { return "nested guest call failed: " + g.err.Error() }
func (g *guestAbort) Unwrap() error { return g.err }

// readBytes copies size bytes at ptr out of guest memory. A zero size is always valid, so
// that the dangling pointers some languages pass for empty slices are accepted.
func readBytes(mem api.Memory, ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return []byte{}, true
	}
	if mem == nil {
		return nil, false
	}
	b, ok := mem.Read(ptr, size)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func readString(mem api.Memory, ptr, size uint32) (string, bool) {
	if size == 0 {
		return "", true
	}
	if mem == nil {
		return "", false
	}
	b, ok := mem.Read(ptr, size)
	if !ok {
		return "", false
	}
	return string(b), true
}

func writeU32(mem api.Memory, ptr, v uint32) bool {
	return mem != nil && mem.WriteUint32Le(ptr, v)
}

func writeU64(mem api.Memory, ptr uint32, v uint64) bool {
	return mem != nil && mem.WriteUint64Le(ptr, v)
}

// canWrite reports whether n bytes at ptr are inside guest memory.
func canWrite(mem api.Memory, ptr, n uint32) bool {
	if mem == nil {
		return false
	}
	return uint64(ptr)+uint64(n) <= uint64(mem.Size())
}

// copyOut hands data to the guest the way proxy-wasm-cpp-host's copyToPointerSize does:
// allocate a buffer with the guest's own allocator, copy the data into it, and store its
// address and size at ptrPtr and sizePtr. Empty data is returned as (0, 0) without
// allocating.
func (vc *vmCall) copyOut(ctx context.Context, data []byte, ptrPtr, sizePtr uint32) Status {
	return vc.copyOutWith(ctx, uint32(len(data)), ptrPtr, sizePtr, func(mem api.Memory, ptr uint32) bool {
		return mem.Write(ptr, data)
	})
}

// copyOutString is copyOut for a string, without converting it to bytes first.
func (vc *vmCall) copyOutString(ctx context.Context, data string, ptrPtr, sizePtr uint32) Status {
	return vc.copyOutWith(ctx, uint32(len(data)), ptrPtr, sizePtr, func(mem api.Memory, ptr uint32) bool {
		return mem.WriteString(ptr, data)
	})
}

// copyOutU64 is copyOut for an 8-byte little-endian value.
func (vc *vmCall) copyOutU64(ctx context.Context, v uint64, ptrPtr, sizePtr uint32) Status {
	return vc.copyOutWith(ctx, 8, ptrPtr, sizePtr, func(mem api.Memory, ptr uint32) bool {
		return mem.WriteUint64Le(ptr, v)
	})
}

// copyOutWith allocates size bytes in the guest and has write fill them.
func (vc *vmCall) copyOutWith(ctx context.Context, size, ptrPtr, sizePtr uint32, write func(api.Memory, uint32) bool) Status {
	mem := vc.vm.mod.Memory()
	// Check the return slots first so a bad pointer does not leak a guest allocation.
	if !canWrite(mem, ptrPtr, 4) || !canWrite(mem, sizePtr, 4) {
		return StatusInvalidMemoryAccess
	}
	if size == 0 {
		writeU32(mem, ptrPtr, 0)
		writeU32(mem, sizePtr, 0)
		return StatusOK
	}
	ptr, st := vc.alloc(ctx, size)
	if st != StatusOK {
		return st
	}
	mem = vc.vm.mod.Memory()
	if !write(mem, ptr) || !writeU32(mem, ptrPtr, ptr) || !writeU32(mem, sizePtr, size) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// view returns size bytes of guest memory at ptr without copying: valid only until the
// guest runs again (an allocation in the guest may move its memory).
func view(mem api.Memory, ptr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	if mem == nil {
		return nil, false
	}
	return mem.Read(ptr, size)
}

// alloc calls the guest's allocator (proxy_on_memory_allocate, or malloc for older
// modules) re-entrantly from inside a host call.
func (vc *vmCall) alloc(ctx context.Context, size uint32) (uint32, Status) {
	fn := vc.vm.allocFn
	if fn == nil {
		return 0, StatusInternalFailure
	}
	// The allocator runs nested inside the current callback: its stack sits one level up.
	stack := vc.vm.stack(vc.vm.w.depth+1, 1)
	stack[0] = uint64(size)
	if err := fn.CallWithStack(ctx, stack); err != nil {
		panic(&guestAbort{err: err})
	}
	ptr := uint32(stack[0])
	if ptr == 0 {
		return 0, StatusInvalidMemoryAccess
	}
	if !canWrite(vc.vm.mod.Memory(), ptr, size) {
		return 0, StatusInvalidMemoryAccess
	}
	return ptr, StatusOK
}

func le64(v uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, v)
	return b
}
