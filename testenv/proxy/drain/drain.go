// Package drain is Envoy's drain manager: once draining starts, connection managers ask
// DrainClose on each response whether to close the connection (Connection: close on
// HTTP/1.1, GOAWAY on HTTP/2). With the gradual strategy (Envoy's default) the chance grows
// linearly over the drain time; with immediate every response closes. Listeners keep
// accepting while they drain, as Envoy's do.
package drain

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Strategy is Envoy's --drain-strategy.
type Strategy int

// Strategies.
const (
	Gradual Strategy = iota
	Immediate
)

// Drainer is one drain scope (the server, or the inbound listeners only).
type Drainer struct {
	strategy Strategy
	duration time.Duration
	now      func() time.Time

	mu      sync.Mutex
	started time.Time
	ch      chan struct{}
}

// New returns a drainer that drains over d.
func New(s Strategy, d time.Duration) *Drainer {
	return &Drainer{strategy: s, duration: d, now: time.Now, ch: make(chan struct{})}
}

// Start begins draining (idempotent).
func (d *Drainer) Start() {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started.IsZero() {
		d.started = d.now()
		close(d.ch)
	}
}

// Draining reports whether Start was called.
func (d *Drainer) Draining() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.started.IsZero()
}

// Started is closed when draining begins.
func (d *Drainer) Started() <-chan struct{} { return d.ch }

// DrainClose reports whether the connection serving the current response should close.
func (d *Drainer) DrainClose() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	started := d.started
	d.mu.Unlock()
	if started.IsZero() {
		return false
	}
	if d.strategy == Immediate || d.duration <= 0 {
		return true
	}
	elapsed := d.now().Sub(started)
	if elapsed >= d.duration {
		return true
	}
	return rand.Float64() < float64(elapsed)/float64(d.duration)
}

// Duration is the drain time.
func (d *Drainer) Duration() time.Duration { return d.duration }

// Combine returns a drainer view that drains when any of ds does.
type Any []*Drainer

// DrainClose is true when any drainer says so.
func (a Any) DrainClose() bool {
	for _, d := range a {
		if d.DrainClose() {
			return true
		}
	}
	return false
}

// Draining is true when any drainer drains.
func (a Any) Draining() bool {
	for _, d := range a {
		if d.Draining() {
			return true
		}
	}
	return false
}
