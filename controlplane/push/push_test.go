package push

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/wasmesh/wasmesh/controlplane/config"
)

type pushes struct {
	mu      sync.Mutex
	got     []*Request
	release chan struct{}
}

func (p *pushes) push(_ context.Context, r *Request) {
	p.mu.Lock()
	p.got = append(p.got, r)
	p.mu.Unlock()
	if p.release != nil {
		<-p.release
	}
}

func (p *pushes) list() []*Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Request(nil), p.got...)
}

func run(t *testing.T, opts DebounceOptions, p *pushes) (chan<- *Request, func()) {
	in := make(chan *Request)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Debounce(ctx, in, opts, p.push, nil); close(done) }()
	return in, func() { cancel(); <-done }
}

func TestDebounceMergesBurst(t *testing.T) {
	p := &pushes{}
	in, stop := run(t, DebounceOptions{After: 50 * time.Millisecond, Max: time.Minute, EnableEDS: true}, p)
	defer stop()
	in <- NewFull(ReasonConfig, config.Key{Kind: config.ServiceEntry, Namespace: "a", Name: "x"})
	in <- NewEDS(map[string]struct{}{"h1": {}})
	in <- NewFull(ReasonConfig, config.Key{Kind: config.ServiceEntry, Namespace: "a", Name: "y"})
	require.Eventually(t, func() bool { return len(p.list()) == 1 }, 5*time.Second, 5*time.Millisecond)
	r := p.list()[0]
	assert.True(t, r.Full)
	assert.Len(t, r.ConfigsUpdated, 2)
	assert.Contains(t, r.EDSHosts, "h1")
	assert.Equal(t, 2, r.Reasons[ReasonConfig])
}

func TestDebounceOnePushInFlightAndEDSBypass(t *testing.T) {
	p := &pushes{release: make(chan struct{})}
	in, stop := run(t, DebounceOptions{After: time.Millisecond, Max: time.Minute, EnableEDS: false}, p)
	defer stop()
	// Endpoint changes skip the debounce when EDS debounce is off.
	in <- NewEDS(map[string]struct{}{"h1": {}})
	require.Eventually(t, func() bool { return len(p.list()) == 1 }, 5*time.Second, time.Millisecond)
	// While that push is in flight, more changes are merged, not pushed.
	in <- NewEDS(map[string]struct{}{"h2": {}})
	in <- NewFull(ReasonConfig)
	in <- NewEDS(map[string]struct{}{"h3": {}})
	assert.Len(t, p.list(), 1)
	p.release <- struct{}{}
	require.Eventually(t, func() bool { return len(p.list()) == 2 }, 5*time.Second, time.Millisecond)
	r := p.list()[1]
	assert.True(t, r.Full)
	assert.Len(t, r.EDSHosts, 2)
	close(p.release)
}

func TestDebounceMaxCapsContinuousChanges(t *testing.T) {
	p := &pushes{}
	in, stop := run(t, DebounceOptions{After: time.Hour, Max: 30 * time.Millisecond, EnableEDS: true}, p)
	defer stop()
	in <- NewFull(ReasonConfig)
	// The quiet period never ends, but the cap forces the push.
	require.Eventually(t, func() bool { return len(p.list()) == 1 }, 5*time.Second, 5*time.Millisecond)
}
