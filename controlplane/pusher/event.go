package pusher

import (
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/xds"
)

// Event is one push to the watchers it concerns: a snapshot and what changed in it. One
// event is shared by every watcher of a push (merging makes a new one), so what it derives is
// computed once.
type Event struct {
	snap   *xds.Snapshot
	req    *push.Request
	queued time.Time

	clustersOnce sync.Once
	clusters     []string
}

// NewEvent is an event of a snapshot for the changes in r (tests and benchmarks build their
// own).
func NewEvent(snap *xds.Snapshot, r *push.Request) *Event {
	return &Event{snap: snap, req: r, queued: time.Now()}
}

// Version is the version of the event's snapshot.
func (e *Event) Version() string { return e.snap.Version }

// Snapshot is the snapshot the event pushes.
func (e *Event) Snapshot() *xds.Snapshot { return e.snap }

// Full reports whether every type may have changed (else only endpoints did).
func (e *Event) Full() bool { return e.req.Full }

// Queued is when the event was handed to the watchers.
func (e *Event) Queued() time.Time { return e.queued }

// Start is when the first change merged into the event arrived; convergence is measured
// from it.
func (e *Event) Start() time.Time { return e.req.Start }

// watches reports whether an EDS subscription names any cluster the push changed.
func (e *Event) watches(sub *Subscription) bool {
	return sub != nil && slices.ContainsFunc(e.EDSClusters(), sub.Has)
}

// EDSClusters lists the EDS clusters of the hosts an endpoints-only push changed, sorted.
func (e *Event) EDSClusters() []string {
	e.clustersOnce.Do(func() {
		for h := range e.req.EDSHosts {
			e.clusters = append(e.clusters, xds.EDSClusterNames(e.snap, h)...)
		}
		sort.Strings(e.clusters)
	})
	return e.clusters
}

// Merge is the event of both pushes, e's and the later o's: o's snapshot, both changes.
func (e *Event) Merge(o *Event) *Event {
	m := &Event{snap: o.snap, req: e.req.Merge(o.req), queued: e.queued}
	if o.queued.Before(m.queued) {
		m.queued = o.queued
	}
	return m
}
