package intern

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

func TestSameStringWhileThereIsRoom(t *testing.T) {
	tab := New(2)
	buf := []byte("200")
	a := tab.String(buf)
	copy(buf, "404")
	b := tab.String([]byte("200"))
	assert.Equal(t, "200", a, "the string does not share the caller's buffer")
	assert.Equal(t, unsafe.StringData(a), unsafe.StringData(b), "the same string both times")

	tab.String([]byte("404"))
	c := tab.String([]byte("503"))
	assert.Equal(t, "503", c)
	assert.Equal(t, 2, tab.Len(), "full: 503 was not kept")
	tab.String([]byte("503"))
	assert.Equal(t, 2, tab.Len())
}

func TestAllocatesOnlyTheFirstTime(t *testing.T) {
	tab := New(8)
	b := []byte("spiffe://cluster.local/ns/prod/sa/ratings")
	tab.String(b)
	assert.Zero(t, testing.AllocsPerRun(100, func() { tab.String(b) }))
}
