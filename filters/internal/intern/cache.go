package intern

import "unsafe"

// Cache maps strings to values by their content, for keys that requests carry and that
// are compared often: it finds an entry by a fingerprint of the key and then compares
// the key eight bytes at a time (equal). A map keyed by the string itself compares keys a
// byte at a time on Wasm, and hashes every byte of them once it holds more than eight.
// Two keys with the same fingerprint share an entry, the later replacing the earlier: a
// miss, never a wrong value. The caller bounds its size (Len, Clear). The zero value is
// not usable; use NewCache.
type Cache[V any] struct {
	m map[uint64]entry[V]
}

type entry[V any] struct {
	key string
	v   V
}

// NewCache returns an empty cache.
func NewCache[V any]() *Cache[V] { return &Cache[V]{m: map[uint64]entry[V]{}} }

// Get returns the value stored for key. key may share memory that changes afterwards (a
// reused buffer): Get does not keep it.
func (c *Cache[V]) Get(key string) (V, bool) {
	if e, ok := c.m[fingerprint(key)]; ok && equal(e.key, key) {
		return e.v, true
	}
	var zero V
	return zero, false
}

// Put stores v for key, which the cache keeps: it must not share memory that changes.
func (c *Cache[V]) Put(key string, v V) { c.m[fingerprint(key)] = entry[V]{key, v} }

// Len is the number of entries.
func (c *Cache[V]) Len() int { return len(c.m) }

// Clear removes every entry.
func (c *Cache[V]) Clear() { clear(c.m) }

// fingerprint hashes s's length and at most eight of its words, spread over it, so that
// it reads at most 64 bytes however long s is. Keys that differ only elsewhere collide,
// which costs a miss (see Cache).
func fingerprint(s string) uint64 {
	const prime = 0x9e3779b97f4a7c15
	n := len(s)
	h := uint64(n) * prime
	p := unsafe.Pointer(unsafe.StringData(s))
	if n < 8 {
		for i := range n {
			h = (h ^ uint64(*(*byte)(unsafe.Add(p, i)))) * prime
		}
		return h ^ h>>32
	}
	// Eight words at offsets 0, step, ..., 7*step, the last ending at n or just before.
	step := (n - 8) / 7
	for k := range 8 {
		h = (h ^ *(*uint64)(unsafe.Add(p, k*step))) * prime
		h ^= h >> 29
	}
	return h
}

// equal reports whether a and b hold the same bytes, comparing eight at a time. Go's ==
// on strings is memequal, which on Wasm walks the bytes one by one (memeqbody in
// internal/bytealg/equal_wasm.s): for telemetry's peer metadata, about 400 bytes, that
// was 2 µs of every request. Its loads, and fingerprint's, are unaligned, as the Go
// runtime's own on Wasm, amd64 and arm64 (runtime/unaligned1.go).
func equal(a, b string) bool {
	n := len(a)
	if n != len(b) {
		return false
	}
	pa, pb := unsafe.Pointer(unsafe.StringData(a)), unsafe.Pointer(unsafe.StringData(b))
	if pa == pb {
		return true
	}
	i := 0
	for ; i+8 <= n; i += 8 {
		if *(*uint64)(unsafe.Add(pa, i)) != *(*uint64)(unsafe.Add(pb, i)) {
			return false
		}
	}
	for ; i < n; i++ {
		if *(*byte)(unsafe.Add(pa, i)) != *(*byte)(unsafe.Add(pb, i)) {
			return false
		}
	}
	return true
}
