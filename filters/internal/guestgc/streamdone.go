package guestgc

import (
	"runtime/debug"
	"sync/atomic"
)

// StreamsPerRecommit is how many StreamDone calls re-apply the collector's target once.
const StreamsPerRecommit = 64

var (
	streams atomic.Uint32
	// target is the GOGC that SetPercent set; unset (natively, until a test sets it),
	// StreamDone leaves the collector alone.
	target atomic.Int32
	set    atomic.Bool
)

// SetPercent sets the collector's target (debug.SetGCPercent), the one StreamDone keeps
// applying.
func SetPercent(percent int) {
	target.Store(int32(percent))
	set.Store(true)
	debug.SetGCPercent(percent)
}

// StreamDone is for a filter's OnHttpStreamDone (and a TCP filter's OnStreamDone): after
// the stream, off its request path, it re-applies the collector's target every
// StreamsPerRecommit streams.
//
// Why: when a collection ends, Go's pacer keeps the next heap goal at least 1 MiB above
// the live heap until its sweep is done (sweepMinHeapDistance, runtime/mgc.go), and it only
// recomputes the goal at its next commit, the next collection's end or a SetGCPercent
// (runtime/mgcpacer.go). A filter's live heap is a few hundred KiB, so the floor, not
// GOGC, sized its heap: the goal stayed at live + 1 MiB at any GOGC. Setting the same
// GOGC again once the sweep has finished commits the pacer without the floor.
func StreamDone() {
	if streams.Add(1)%StreamsPerRecommit == 0 && set.Load() {
		debug.SetGCPercent(int(target.Load()))
	}
}
