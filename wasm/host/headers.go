package host

import (
	"strings"
	"sync"
)

// Headers is an ordered multi-map of HTTP fields (headers, trailers or gRPC metadata) as a
// guest sees it. Keys are stored lower-cased, as Envoy's LowerCaseString does, and pseudo
// headers (":path", ":status", ...) are ordinary entries. The embedder builds one per map,
// passes it to a stream callback and reads it back afterwards to see the guest's changes.
// Safe for concurrent use.
type Headers struct {
	mu    sync.Mutex
	pairs [][2]string
}

// NewHeaders builds a map from pairs (keys are lower-cased).
func NewHeaders(pairs ...[2]string) *Headers {
	h := &Headers{pairs: make([][2]string, 0, len(pairs))}
	for _, p := range pairs {
		h.pairs = append(h.pairs, [2]string{strings.ToLower(p[0]), p[1]})
	}
	return h
}

// Pairs returns a copy of the entries in order.
func (h *Headers) Pairs() [][2]string {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][2]string(nil), h.pairs...)
}

// Len is the number of entries.
func (h *Headers) Len() int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pairs)
}

// ByteSize is the sum of key and value lengths, Envoy's HeaderMap::byteSize used by the
// request.total_size and response.total_size attributes.
func (h *Headers) ByteSize() int {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.pairs {
		n += len(p[0]) + len(p[1])
	}
	return n
}

// Get returns the first value of key.
func (h *Headers) Get(key string) (string, bool) {
	if h == nil {
		return "", false
	}
	key = strings.ToLower(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.pairs {
		if p[0] == key {
			return p[1], true
		}
	}
	return "", false
}

// Values returns every value of key in order.
func (h *Headers) Values(key string) []string {
	if h == nil {
		return nil
	}
	key = strings.ToLower(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, p := range h.pairs {
		if p[0] == key {
			out = append(out, p[1])
		}
	}
	return out
}

// Add appends an entry.
func (h *Headers) Add(key, value string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pairs = append(h.pairs, [2]string{strings.ToLower(key), value})
}

// Set replaces the value of key: the first entry keeps its position, later duplicates are
// removed, and a missing key is appended (Envoy's setCopy).
func (h *Headers) Set(key, value string) {
	key = strings.ToLower(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	found := false
	out := h.pairs[:0]
	for _, p := range h.pairs {
		if p[0] == key {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	h.pairs = out
	if !found {
		h.pairs = append(h.pairs, [2]string{key, value})
	}
}

// Del removes every entry of key.
func (h *Headers) Del(key string) {
	key = strings.ToLower(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.pairs[:0]
	for _, p := range h.pairs {
		if p[0] != key {
			out = append(out, p)
		}
	}
	h.pairs = out
}

// SetPairs replaces all entries.
func (h *Headers) SetPairs(pairs [][2]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pairs = h.pairs[:0]
	for _, p := range pairs {
		h.pairs = append(h.pairs, [2]string{strings.ToLower(p[0]), p[1]})
	}
}

// Clone copies the map.
func (h *Headers) Clone() *Headers {
	if h == nil {
		return nil
	}
	return NewHeaders(h.Pairs()...)
}

// joined returns the values of key joined by ",", as Envoy presents a repeated header in
// the request.headers / response.headers attribute maps.
func (h *Headers) joined(key string) (string, bool) {
	v := h.Values(key)
	if len(v) == 0 {
		return "", false
	}
	return strings.Join(v, ","), true
}
