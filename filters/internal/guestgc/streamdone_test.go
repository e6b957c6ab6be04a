//go:build !wasip1

package guestgc

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heap reads the pacer's heap goal and the live heap its last collection marked.
func heap() (goal, live uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// The floor is the runtime's, in every Go program: the test runs natively, where a
// collection and its sweep can be awaited (runtime.GC), with a guest's target.
func TestStreamDoneLiftsThePacersFloorAfterACollection(t *testing.T) {
	const floor = 1 << 20 // runtime/mgc.go sweepMinHeapDistance
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	SetPercent(15)
	defer set.Store(false)

	runtime.GC() // its sweep is done when GC returns, but the pacer committed before it
	goal, live := heap()
	require.GreaterOrEqual(t, goal, live+floor, "a collection's end leaves the goal 1 MiB above the live heap")

	for range StreamsPerRecommit - 1 - streams.Load()%StreamsPerRecommit {
		StreamDone()
	}
	goal, _ = heap()
	require.GreaterOrEqual(t, goal, live+floor, "nothing before the %dth stream", StreamsPerRecommit)

	StreamDone()
	goal, live = heap()
	assert.Less(t, goal, live+floor, "the goal follows GOGC again")
	assert.Equal(t, 15, debug.SetGCPercent(100), "the target is the one set")
}
