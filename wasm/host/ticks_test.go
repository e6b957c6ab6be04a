package host

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTicksFollowTheHostClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := NewManualClock(start)
	f := newFixture(t, "kitchen", PluginConfig{Configuration: []byte("tick=100")}, Environment{Clock: clock})
	clock.Advance(99 * time.Millisecond)
	m, _ := f.p.Metrics().Get("ticks_total", MetricCounter)
	assert.Equal(t, int64(0), m.Value)
	clock.Advance(251 * time.Millisecond)
	m, _ = f.p.Metrics().Get("ticks_total", MetricCounter)
	assert.Equal(t, int64(3), m.Value)
	var ticks []string
	for _, msg := range f.logs.messages() {
		if len(msg) > 8 && msg[:8] == "tick at " {
			ticks = append(ticks, msg[8:])
		}
	}
	// Each tick sees the clock at its due time.
	want := []string{}
	for i := 1; i <= 3; i++ {
		want = append(want, strconv.FormatInt(start.Add(time.Duration(i)*100*time.Millisecond).UnixNano(), 10))
	}
	assert.Equal(t, want, ticks)
}

func TestTimeLogsAndWASI(t *testing.T) {
	clock := NewManualClock(time.Unix(1_700_000_000, 123))
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{Clock: clock})
	_, h := f.op(t, "time,log-levels")
	assert.Equal(t, strconv.FormatInt(clock.Now().UnixNano(), 10), hget(h, "x-time"))
	// The recorder enables every level: the guest is told trace (0); a level out of range
	// is BadArgument.
	assert.Equal(t, "0:2", hget(h, "x-log-level"))
	levels := map[string]slog.Level{}
	f.logs.mu.Lock()
	for _, r := range f.logs.records {
		levels[r.Msg] = r.Level
	}
	f.logs.mu.Unlock()
	assert.Equal(t, SlogTrace, levels["level 0"])
	assert.Equal(t, slog.LevelDebug, levels["level 1"])
	assert.Equal(t, slog.LevelInfo, levels["level 2"])
	assert.Equal(t, slog.LevelWarn, levels["level 3"])
	assert.Equal(t, slog.LevelError, levels["level 4"])
	assert.Equal(t, SlogCritical, levels["level 5"])
	// The guest's stderr (Go's println) is logged line by line at error level.
	rec, ok := f.logs.find("stderr line from guest")
	require.True(t, ok)
	assert.Equal(t, "stderr", rec.Attrs["source"])
	assert.Equal(t, slog.LevelError, rec.Level)

	warn := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f = newFixture(t, "kitchen", PluginConfig{}, Environment{Logger: warn})
	_, h = f.op(t, "log-levels")
	assert.Equal(t, "3:2", hget(h, "x-log-level"))
}

func TestForeignFunctions(t *testing.T) {
	echo := func(_ context.Context, args []byte) ([]byte, Status) { return append(args, "-echo"...), StatusOK }
	f := newFixture(t, "kitchen", PluginConfig{}, Environment{ForeignFunctions: map[string]ForeignFunction{"echo": echo}})
	_, h := f.op(t, "foreign")
	assert.Equal(t, "0:ping-echo:1", hget(h, "x-foreign"))
	require.NoError(t, f.p.CallForeignFunction(context.Background(), 7, []byte("args")))
	assert.Contains(t, f.logs.messages(), "foreign function 7 args=args status=0")

	f = newFixture(t, "kitchen", PluginConfig{}, Environment{})
	_, h = f.op(t, "foreign")
	assert.Equal(t, "12::12", hget(h, "x-foreign"))

	// A function that fails with output: the guest gets its status (its SDK then drops the
	// output).
	failing := func(context.Context, []byte) ([]byte, Status) { return []byte("why"), StatusBadArgument }
	f = newFixture(t, "kitchen", PluginConfig{}, Environment{ForeignFunctions: map[string]ForeignFunction{"echo": failing}})
	_, h = f.op(t, "foreign")
	assert.Equal(t, "2::1", hget(h, "x-foreign"))
}

// Close follows Envoy: a root context that returns false from proxy_on_done is waited for
// until it calls proxy_done (here from a tick), then deleted.
func TestCloseWaitsForProxyDone(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	f := newFixture(t, "kitchen", PluginConfig{Configuration: []byte("tick=100\ndefer-done=1\ndone-on-tick=1")}, Environment{Clock: clock})
	closed := make(chan error, 1)
	go func() { closed <- f.p.Close(context.Background()) }()
	eventually(t, &f.logs.notify, func() bool { _, ok := f.logs.find("root done deferred"); return ok }, "on_done returned false")
	select {
	case err := <-closed:
		t.Fatalf("Close returned before proxy_done: %v", err)
	default:
	}
	clock.Advance(100 * time.Millisecond)
	require.NoError(t, <-closed)
	_, ok := f.logs.find("root deleted")
	assert.True(t, ok)
	_, err := f.p.NewHTTPStream(context.Background(), StreamOptions{})
	assert.ErrorIs(t, err, ErrClosed)

	// Without proxy_done, Close gives up when its context ends.
	f = newFixture(t, "kitchen", PluginConfig{Configuration: []byte("defer-done=1")}, Environment{Clock: clock})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, f.p.Close(ctx), context.DeadlineExceeded)
}

// A ManualClock timer stopped before it is due does not fire, whichever place it has among
// the pending timers (the earliest too), and stop reports whether it stopped it.
func TestManualClockStopsAnyPendingTimer(t *testing.T) {
	clock := NewManualClock(time.Unix(0, 0))
	var fired []int
	stops := make([]func() bool, 3)
	for i := range stops {
		stops[i] = clock.AfterFunc(time.Duration(i+1)*time.Second, func() { fired = append(fired, i) })
	}
	assert.True(t, stops[0]()) // the earliest
	assert.True(t, stops[2]())
	assert.False(t, stops[0](), "already stopped")
	clock.Advance(5 * time.Second)
	assert.Equal(t, []int{1}, fired)
	assert.False(t, stops[1](), "already fired")
}
