// Package intern keeps one copy of the strings a filter reads on every request (a status
// code, a principal, a service name), so reading them into a reused buffer and turning
// them into strings allocates only the first time: allocation is among the dearest things
// a Go guest does in Wasm. Its Cache, which the Table is built on, serves other caches
// keyed by what a request carries (telemetry's peer metadata).
package intern

import "unsafe"

// Table is a bounded set of strings. Once full it stops growing and hands out fresh
// strings, so values an attacker controls (header values) cannot grow it without limit.
// The zero value is not usable; use New.
type Table struct {
	max  int
	strs *Cache[string]
}

// New returns a table holding at most max strings.
func New(max int) *Table { return &Table{max: max, strs: NewCache[string]()} }

// String returns b as a string: the same string every time while the table has room.
func (t *Table) String(b []byte) string {
	if s, ok := t.strs.Get(unsafe.String(unsafe.SliceData(b), len(b))); ok {
		return s
	}
	s := string(b)
	if t.strs.Len() < t.max {
		t.strs.Put(s, s)
	}
	return s
}

// Len is the number of strings held.
func (t *Table) Len() int { return t.strs.Len() }
