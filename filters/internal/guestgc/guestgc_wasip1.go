//go:build wasip1

package guestgc

import "runtime/debug"

// Percent is the collector's target: a collection starts when the heap has grown by this
// share of the live data.
const Percent = 25

func init() { debug.SetGCPercent(Percent) }
