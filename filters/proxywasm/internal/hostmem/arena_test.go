package hostmem

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// write fills the memory at addr as the host would.
func (a *Arena) write(addr uintptr, data string) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.buf)))
	if addr >= base && addr < base+uintptr(len(a.buf)) {
		copy(a.buf[addr-base:], data)
		return
	}
	for _, e := range a.Overflow.entries {
		if e.addr == addr {
			copy(e.buf, data)
		}
	}
}

func TestArenaIsAStack(t *testing.T) {
	a := NewArena(64)
	outer := a.Mark()
	slots := a.Slots(3)
	require.Len(t, slots, 3)
	addr := a.Alloc(5)
	a.write(addr, "hello")
	assert.Zero(t, addr%8, "8-byte aligned")

	inner := a.Mark()
	nested := a.Alloc(3)
	a.write(nested, "abc")
	got, ok := a.View(nested, 3)
	require.True(t, ok)
	assert.Equal(t, "abc", string(got))
	a.Release(inner)

	got, ok = a.View(addr, 5)
	require.True(t, ok, "a nested release keeps the outer call's result")
	assert.Equal(t, "hello", string(got))
	assert.Equal(t, 5, cap(got), "the guest must not see past what the host wrote")
	_, ok = a.View(nested, 3)
	assert.False(t, ok, "released memory is not a valid result")

	a.Release(outer)
	assert.Zero(t, a.InUse())
}

func TestArenaOverflowsToTheHeap(t *testing.T) {
	a := NewArena(16)
	m := a.Mark()
	small := a.Alloc(5)
	big := a.Alloc(100)
	a.write(big, "big result")
	assert.Equal(t, 1, a.Overflow.Len())
	got, ok := a.View(big, 10)
	require.True(t, ok)
	assert.Equal(t, "big result", string(got))
	_, ok = a.View(small, 8)
	assert.True(t, ok, "sizes round up to 8 within the arena")
	_, ok = a.View(small, 17)
	assert.False(t, ok, "size beyond what was allocated")

	orphan := a.Alloc(100) // allocated by a host call that then failed
	a.Release(m)
	assert.Zero(t, a.Overflow.Len(), "the release drops what nobody took")
	_, ok = a.View(orphan, 1)
	assert.False(t, ok)

	assert.Len(t, a.Scratch(100), 100, "scratch beyond the arena comes from the heap")
	assert.Len(t, a.Slots(100), 100)
}

func TestArenaZeroSizeAndForeignAddresses(t *testing.T) {
	a := NewArena(64)
	x, y := a.Alloc(0), a.Alloc(0)
	assert.NotZero(t, x)
	assert.NotEqual(t, x, y)
	_, ok := a.View(y+1000, 1)
	assert.False(t, ok, "never allocated")
	s := a.Slots(2)
	s[0], s[1] = 7, 9
	a.Reset()
	assert.Zero(t, a.InUse())
	assert.Equal(t, []uint32{0, 0}, a.Slots(2), "slots start zeroed")
}
