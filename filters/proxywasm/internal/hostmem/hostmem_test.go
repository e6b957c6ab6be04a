package hostmem

import (
	"runtime"
	"testing"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllocTake(t *testing.T) {
	var tab Table
	buf, addr := tab.Alloc(5)
	require.Len(t, buf, 5)
	copy(buf, "hello")
	assert.Equal(t, 1, tab.Len())

	got, ok := tab.Take(addr, 5)
	require.True(t, ok)
	assert.Equal(t, "hello", string(got))
	assert.Equal(t, 0, tab.Len())

	_, ok = tab.Take(addr, 5)
	assert.False(t, ok, "a buffer is handed over once")
}

func TestTakeShorterThanAllocated(t *testing.T) {
	var tab Table
	buf, addr := tab.Alloc(8)
	copy(buf, "abcdefgh")
	got, ok := tab.Take(addr, 3)
	require.True(t, ok)
	assert.Equal(t, "abc", string(got))
	assert.Equal(t, 3, cap(got), "the guest must not see past what the host wrote")
}

func TestTakeRejectsWhatTheHostMadeUp(t *testing.T) {
	var tab Table
	_, addr := tab.Alloc(4)
	_, ok := tab.Take(addr, 5)
	assert.False(t, ok, "size beyond the allocation")
	_, ok = tab.Take(addr+1, 1)
	assert.False(t, ok, "address never allocated")
	assert.Equal(t, 1, tab.Len(), "a rejected take leaves the buffer to be released")
}

func TestZeroSizeGetsDistinctAddresses(t *testing.T) {
	var tab Table
	_, a := tab.Alloc(0)
	_, b := tab.Alloc(0)
	assert.NotZero(t, a)
	assert.NotEqual(t, a, b)
	got, ok := tab.Take(b, 0)
	require.True(t, ok)
	assert.Empty(t, got)
}

func TestReleaseSinceDropsOnlyTheCallsOrphans(t *testing.T) {
	var tab Table
	_, outer := tab.Alloc(1) // an outer call's result, not taken yet
	mark := tab.Mark()
	_, orphan := tab.Alloc(1) // allocated during the inner call and never returned
	_, inner := tab.Alloc(1)
	_, ok := tab.Take(inner, 1)
	require.True(t, ok)

	tab.ReleaseSince(mark)
	assert.Equal(t, 1, tab.Len())
	_, ok = tab.Take(orphan, 1)
	assert.False(t, ok)
	_, ok = tab.Take(outer, 1)
	assert.True(t, ok)
}

func TestReset(t *testing.T) {
	var tab Table
	tab.Alloc(1)
	tab.Alloc(2)
	tab.Reset()
	assert.Equal(t, 0, tab.Len())
}

// The point of the table: between Alloc and Take the guest holds only an integer
// address, and the buffer must survive collections; after Take or a release it must be
// collectable again, or every host call would leak.
func TestTableKeepsBuffersAliveUntilHandedOver(t *testing.T) {
	var tab Table
	taken := allocWeak(&tab, 4096)
	orphan := allocWeak(&tab, 4096)

	collect()
	require.NotNil(t, taken.ptr.Value(), "collected while only the host knew its address")
	require.NotNil(t, orphan.ptr.Value())
	assert.Equal(t, byte(0xAB), lastByte(t, &tab, taken.addr, 4096),
		"contents written before the collection are intact")
	tab.ReleaseSince(0)

	collect()
	assert.Nil(t, taken.ptr.Value(), "still referenced after Take")
	assert.Nil(t, orphan.ptr.Value(), "still referenced after release")
}

type weakAlloc struct {
	ptr  weak.Pointer[byte]
	addr uintptr
}

// allocWeak allocates through the table, fills the buffer and keeps only a weak
// pointer and the address, like the host.
func allocWeak(tab *Table, size uint32) weakAlloc {
	buf, addr := tab.Alloc(size)
	for i := range buf {
		buf[i] = 0xAB
	}
	return weakAlloc{ptr: weak.Make(&buf[0]), addr: addr}
}

// lastByte takes the buffer and reads it, letting go of it on return like guest code
// done with a result.
func lastByte(t *testing.T, tab *Table, addr uintptr, size uint32) byte {
	b, ok := tab.Take(addr, size)
	require.True(t, ok)
	return b[len(b)-1]
}

func collect() {
	for range 3 {
		runtime.GC()
	}
}
