package service

import (
	"sync"
	"time"
)

// overCache remembers the counter keys known over their limit until their window ends, so
// that further hits on them are answered without a Redis round trip (as the reference
// service's local cache). A key names its window, so an entry is never stale before it
// expires.
type overCache struct {
	mu      sync.RWMutex
	until   map[string]time.Time
	sweepAt int
}

func newOverCache() *overCache { return &overCache{until: map[string]time.Time{}, sweepAt: 1024} }

func (c *overCache) over(key string, now time.Time) bool {
	c.mu.RLock()
	t, ok := c.until[key]
	c.mu.RUnlock()
	return ok && now.Before(t)
}

func (c *overCache) add(key string, until, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.until[key] = until
	if len(c.until) < c.sweepAt {
		return
	}
	for k, t := range c.until {
		if !now.Before(t) {
			delete(c.until, k)
		}
	}
	c.sweepAt = max(1024, 2*len(c.until))
}
