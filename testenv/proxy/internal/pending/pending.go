// Package pending counts work in progress that a shutdown waits for: the connections a
// listener accepted but has not yet handed to a filter chain, and those an HTTP manager
// took but whose first request has not reached the handler.
package pending

import (
	"context"
	"sync"
)

// Count is a number of pieces of work in progress; the zero value is empty and ready to use.
type Count struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0; nil while nobody waits
}

// Add counts one more piece of work.
func (c *Count) Add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

// Done counts one piece of work finished. Done without its Add panics, as a sync.WaitGroup
// does, because the count could otherwise never reach zero for the right reason.
func (c *Count) Done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		panic("pending: Done without Add")
	}
	c.n--
	if c.n == 0 && c.zero != nil {
		close(c.zero)
		c.zero = nil
	}
}

// Wait returns true once nothing is in progress, or false when ctx ends first. Work added
// while it waits, before the count reaches zero, is waited for too.
func (c *Count) Wait(ctx context.Context) bool {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return true
	}
	if c.zero == nil {
		c.zero = make(chan struct{})
	}
	zero := c.zero
	c.mu.Unlock()
	select {
	case <-zero:
		return true
	case <-ctx.Done():
		return false
	}
}
