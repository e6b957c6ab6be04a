package intern

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEqualComparesEveryByte(t *testing.T) {
	for n := 0; n <= 40; n++ {
		a := strings.Repeat("x", n)
		assert.True(t, equal(a, strings.Clone(a)), "length %d", n)
		for i := 0; i < n; i++ {
			b := []byte(a)
			b[i] = 'y'
			assert.False(t, equal(a, string(b)), "length %d, byte %d differs", n, i)
		}
		assert.False(t, equal(a, a+"x"), "length %d against %d", n, n+1)
	}
}

// A key the fingerprint does not tell apart from a stored one is a miss, not the other
// key's value.
func TestCacheComparesKeysSharingAFingerprint(t *testing.T) {
	a := strings.Repeat("a", 100)
	b := []byte(a)
	b[10] = 'b' // for 100 bytes the sampled words start at 0, 13, 26...: byte 10 is in none
	if fingerprint(string(b)) != fingerprint(a) {
		t.Fatal("the keys' fingerprints differ: choose a byte the fingerprint does not read")
	}
	c := NewCache[int]()
	c.Put(a, 1)
	v, ok := c.Get(string(b))
	assert.False(t, ok, "got %d", v)
	v, ok = c.Get(strings.Clone(a))
	assert.True(t, ok)
	assert.Equal(t, 1, v)

	c.Put(string(b), 2)
	assert.Equal(t, 1, c.Len(), "the later key replaced the earlier in the shared entry")
	_, ok = c.Get(a)
	assert.False(t, ok)
}

func TestCacheGetPutClear(t *testing.T) {
	c := NewCache[string]()
	c.Put("principal", "p")
	v, ok := c.Get(string([]byte("principal")))
	assert.True(t, ok, "found by content, not by the string's address")
	assert.Equal(t, "p", v)
	_, ok = c.Get("principals")
	assert.False(t, ok)
	c.Clear()
	assert.Zero(t, c.Len())
	_, ok = c.Get("principal")
	assert.False(t, ok)
}
