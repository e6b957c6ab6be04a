// Package latch is a one-way event with callbacks: they run once it is set, or at once when
// registered after. The router arms its timers on it when the request is complete, and a
// secret provider releases the listeners and clusters warming on it.
package latch

import "sync"

// Latch is set once; the zero value is unset and ready to use.
type Latch struct {
	mu  sync.Mutex
	set bool
	fns []func()
}

// Set sets the latch and runs the callbacks registered so far, in order, on this goroutine;
// setting it again does nothing.
func (l *Latch) Set() {
	l.mu.Lock()
	if l.set {
		l.mu.Unlock()
		return
	}
	l.set = true
	fns := l.fns
	l.fns = nil
	l.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

// OnSet runs f once the latch is set: at once if it already is.
func (l *Latch) OnSet(f func()) {
	l.mu.Lock()
	if l.set {
		l.mu.Unlock()
		f()
		return
	}
	l.fns = append(l.fns, f)
	l.mu.Unlock()
}

// IsSet reports whether the latch is set.
func (l *Latch) IsSet() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.set
}
