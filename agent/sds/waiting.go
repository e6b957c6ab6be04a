package sds

import (
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// waitingCache is a LinearCache whose State of the World watches for secrets that do
// not exist yet wait until one does.
type waitingCache struct {
	*cachev3.LinearCache
	mu     sync.Mutex
	parked map[*parkedWatch]struct{}
}

type parkedWatch struct {
	req    *cachev3.Request
	sub    cachev3.Subscription
	out    chan cachev3.Response
	cancel func() // the cache's, once the watch is handed over
}

func newWaitingCache(c *cachev3.LinearCache) *waitingCache {
	return &waitingCache{LinearCache: c, parked: map[*parkedWatch]struct{}{}}
}

// CreateWatch hands the watch to the cache, or holds it while nothing it asks for exists.
func (c *waitingCache) CreateWatch(req *cachev3.Request, sub cachev3.Subscription, out chan cachev3.Response) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.anyExists(sub) {
		return c.LinearCache.CreateWatch(req, sub, out)
	}
	p := &parkedWatch{req: req, sub: sub, out: out}
	c.parked[p] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.parked, p)
		if p.cancel != nil {
			p.cancel()
		}
	}, nil
}

// update sets the resources, then hands the held watches that now have something to
// the cache, which answers them.
func (c *waitingCache) update(res map[string]types.Resource) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.LinearCache.UpdateResources(res, nil); err != nil {
		return err
	}
	for p := range c.parked {
		if !c.anyExists(p.sub) {
			continue
		}
		cancel, err := c.LinearCache.CreateWatch(p.req, p.sub, p.out)
		if err != nil {
			return err
		}
		p.cancel = cancel
		delete(c.parked, p)
	}
	return nil
}

func (c *waitingCache) anyExists(sub cachev3.Subscription) bool {
	if sub.IsWildcard() {
		return c.LinearCache.NumResources() > 0
	}
	have := c.LinearCache.GetResources()
	for name := range sub.SubscribedResources() {
		if _, ok := have[name]; ok {
			return true
		}
	}
	return false
}
