package ratelimit

import (
	"encoding/binary"
	"time"
)

// state is one bucket's state, decoded. Its encoding is the shared-data value, so every
// VM of the proxy reads and writes the same bytes (little-endian, times as Unix
// nanoseconds):
//
//	token bucket    0x01 | tokens uint32   | last fill int64                    13 bytes
//	fixed window    0x02 | used uint32     | window start int64                 13 bytes
//	rolling window  0x03 | newest slot start int64 | used uint32 × slots   9 + 4×slots bytes
//
// A rolling window's slots are a ring indexed by (slot start / bucket duration) mod slots.
// A value whose tag or length does not fit the policy (the configuration changed the
// algorithm or the slot count) is replaced by a fresh state, so reconfiguring never
// strands a bucket.
type state struct {
	alg   Algorithm
	count uint32   // token bucket: tokens left; fixed window: amount used
	at    int64    // token bucket: last fill; fixed window: window start; rolling: newest slot start
	slots []uint32 // rolling window only; reused between decisions
}

const (
	shortStateLen  = 13
	rollingHeadLen = 9
)

func encodedLen(p *Policy) int {
	if p.Algorithm == RollingWindow {
		return rollingHeadLen + 4*p.slots()
	}
	return shortStateLen
}

// decode reads b into s, reporting false when b is not a state of policy p.
func (s *state) decode(b []byte, p *Policy) bool {
	if len(b) != encodedLen(p) || Algorithm(b[0]) != p.Algorithm {
		return false
	}
	s.alg = p.Algorithm
	if p.Algorithm != RollingWindow {
		s.count = binary.LittleEndian.Uint32(b[1:5])
		s.at = int64(binary.LittleEndian.Uint64(b[5:13]))
		return true
	}
	s.at = int64(binary.LittleEndian.Uint64(b[1:9]))
	s.resizeSlots(p.slots())
	for i := range s.slots {
		s.slots[i] = binary.LittleEndian.Uint32(b[rollingHeadLen+4*i:])
	}
	return true
}

// appendTo appends the encoding of s to buf.
func (s *state) appendTo(buf []byte) []byte {
	buf = append(buf, byte(s.alg))
	if s.alg != RollingWindow {
		buf = binary.LittleEndian.AppendUint32(buf, s.count)
		return binary.LittleEndian.AppendUint64(buf, uint64(s.at))
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(s.at))
	for _, n := range s.slots {
		buf = binary.LittleEndian.AppendUint32(buf, n)
	}
	return buf
}

func (s *state) resizeSlots(n int) {
	if cap(s.slots) < n {
		s.slots = make([]uint32, n)
	}
	s.slots = s.slots[:n]
}

// fresh sets s to a new bucket at now: a full token bucket (Envoy's buckets start full),
// an unused window.
func (s *state) fresh(p *Policy, now int64) {
	s.alg = p.Algorithm
	switch p.Algorithm {
	case TokenBucket:
		s.count, s.at = p.MaxTokens, now
	case FixedWindow:
		s.count, s.at = 0, floorTo(now, int64(p.ValidDuration))
	case RollingWindow:
		s.count, s.at = 0, floorTo(now, int64(p.BucketDuration))
		s.resizeSlots(p.slots())
		clear(s.slots)
	}
}

// advance brings s up to now: adds the fills that fell due, starts a new window, or
// retires expired slots. It is a pure function of the stored state and the clock, so the
// tick and a request computing it independently agree; it reports whether s changed.
func (s *state) advance(p *Policy, now int64) bool {
	switch p.Algorithm {
	case TokenBucket:
		return s.advanceBucket(p, now)
	case FixedWindow:
		start := floorTo(now, int64(p.ValidDuration))
		if start == s.at {
			return false
		}
		// A different window, later or (the clock stepped back) earlier: start counting
		// again rather than refuse requests until the clock catches up.
		s.count, s.at = 0, start
		return true
	case RollingWindow:
		return s.advanceRolling(p, now)
	}
	return false
}

func (s *state) advanceBucket(p *Policy, now int64) bool {
	changed := false
	if s.count > p.MaxTokens { // the configuration shrank the bucket
		s.count, changed = p.MaxTokens, true
	}
	fill := int64(p.FillInterval)
	if now < s.at {
		// The clock stepped back. Within one interval it is noise; beyond it, re-anchor
		// the fill grid so the bucket does not stop filling until the clock catches up.
		if s.at-now >= fill {
			s.at, changed = now, true
		}
		return changed
	}
	n := (now - s.at) / fill
	if n == 0 {
		return changed
	}
	s.at += n * fill
	// n can be huge after a long idle period; once n ≥ MaxTokens the bucket is full
	// whatever TokensPerFill (≥ 1) is, and the multiplication below cannot overflow.
	if uint64(n) >= uint64(p.MaxTokens) {
		s.count = p.MaxTokens
	} else {
		s.count = uint32(min(uint64(s.count)+uint64(n)*uint64(p.TokensPerFill), uint64(p.MaxTokens)))
	}
	return true
}

func (s *state) advanceRolling(p *Policy, now int64) bool {
	bd := int64(p.BucketDuration)
	cur := floorTo(now, bd)
	n := int64(len(s.slots))
	switch {
	case cur == s.at:
		return false
	case cur < s.at:
		// The clock stepped back: keep counting into the newest slot unless the step is
		// a whole window, in which case the slots say nothing about the present.
		if s.at-cur < int64(p.ValidDuration) {
			return false
		}
		clear(s.slots)
	case (cur-s.at)/bd >= n:
		clear(s.slots)
	default:
		for t := s.at + bd; t <= cur; t += bd {
			s.slots[slotIndex(t, bd, n)] = 0
		}
	}
	s.at = cur
	return true
}

// take charges hits against an advanced state and returns the decision. A denied
// request takes nothing.
func (s *state) take(p *Policy, hits uint32, now int64) Decision {
	d := Decision{Limit: p.Limit()}
	switch p.Algorithm {
	case TokenBucket:
		if s.count >= hits {
			s.count -= hits
			d.Allowed = true
		}
		d.Remaining = s.count
		d.Reset = time.Duration(s.at + int64(p.FillInterval) - now)
	case FixedWindow:
		if uint64(s.count)+uint64(hits) <= uint64(p.MaxAmount) {
			s.count += hits
			d.Allowed = true
		}
		d.Remaining = p.MaxAmount - min(s.count, p.MaxAmount)
		d.Reset = time.Duration(s.at + int64(p.ValidDuration) - now)
	case RollingWindow:
		bd, n := int64(p.BucketDuration), int64(len(s.slots))
		newest := slotIndex(s.at, bd, n)
		var used uint64
		for _, c := range s.slots {
			used += uint64(c)
		}
		if used+uint64(hits) <= uint64(p.MaxAmount) {
			s.slots[newest] += hits
			used += uint64(hits)
			d.Allowed = true
		}
		d.Remaining = uint32(uint64(p.MaxAmount) - min(used, uint64(p.MaxAmount)))
		// The quota grows when the oldest slot with use leaves the window. Walk the ring
		// from the oldest slot (the one after the newest) without dividing per slot.
		for age := n - 1; age >= 0; age-- {
			i := newest - age
			if i < 0 {
				i += n
			}
			if s.slots[i] > 0 {
				d.Reset = time.Duration(s.at - age*bd + int64(p.ValidDuration) - now)
				break
			}
		}
	}
	if d.Reset < 0 {
		d.Reset = 0
	}
	return d
}

// floorTo rounds t down to a multiple of d (d > 0), also for negative t.
func floorTo(t, d int64) int64 {
	q := t / d
	if t%d != 0 && t < 0 {
		q--
	}
	return q * d
}

func slotIndex(t, bd, n int64) int64 {
	i := floorTo(t, bd) / bd % n
	if i < 0 {
		i += n
	}
	return i
}
