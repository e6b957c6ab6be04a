package kube

import (
	"sync"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

// resource is what a queued ref names.
type resource uint8

const (
	resService   resource = iota // a Service (an EndpointSlice change queues its Service)
	resPod                       // a Pod
	resNode                      // a Node
	resNamespace                 // a Namespace
	resConfig                    // an Istio config of ref.kind
	resCRD                       // a CustomResourceDefinition (name only) of a kind not yet served
)

// ref names one object whose current state the worker reads from the informers' caches.
type ref struct {
	res      resource
	kind     config.Kind
	ns, name string
}

// queue is an ordered set of refs: a ref queued again before the worker takes it stays
// once, where it was, so a burst of changes to one object costs one look.
type queue struct {
	mu      sync.Mutex
	pending map[ref]struct{}
	order   []ref
	wake    chan struct{}
}

func newQueue() *queue { return &queue{pending: map[ref]struct{}{}, wake: make(chan struct{}, 1)} }

func (q *queue) add(r ref) {
	q.mu.Lock()
	if _, ok := q.pending[r]; !ok {
		q.pending[r] = struct{}{}
		q.order = append(q.order, r)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns every ref queued so far, in order, and empties the queue.
func (q *queue) take() []ref {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.order
	q.order = nil
	clear(q.pending)
	return out
}
