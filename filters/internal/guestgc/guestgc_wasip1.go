//go:build wasip1

package guestgc

// Percent is the collector's target: a collection starts when the heap has grown by this
// share of the live data.
const Percent = 15

func init() { SetPercent(Percent) }
