package push

import (
	"context"
	"time"
)

// DebounceOptions are istiod's debounce settings.
type DebounceOptions struct {
	// After is the quiet period: a push starts once no change arrived for this long
	// (PILOT_DEBOUNCE_AFTER, 100 ms).
	After time.Duration
	// Max caps how long changes are held back while they keep arriving (PILOT_DEBOUNCE_MAX, 10 s).
	Max time.Duration
	// EnableEDS debounces endpoints-only changes too; when false they are pushed at once
	// (PILOT_ENABLE_EDS_DEBOUNCE, true).
	EnableEDS bool

	// clock is the wall clock unless a test drives time by hand.
	clock clock
}

// clock is the debouncer's time source: the quiet period and the cap are measured with Now
// and waited for with timers, so a test can step time explicitly instead of sleeping.
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer fires once on C unless stopped first.
type timer interface {
	C() <-chan time.Time
	Stop()
}

type wallClock struct{}

func (wallClock) Now() time.Time                 { return time.Now() }
func (wallClock) NewTimer(d time.Duration) timer { return wallTimer{time.NewTimer(d)} }

type wallTimer struct{ t *time.Timer }

func (w wallTimer) C() <-chan time.Time { return w.t.C }
func (w wallTimer) Stop()               { w.t.Stop() }

// DefaultDebounce returns Istio's defaults.
func DefaultDebounce() DebounceOptions {
	return DebounceOptions{After: 100 * time.Millisecond, Max: 10 * time.Second, EnableEDS: true}
}

// Debounce merges requests from in and calls push with the merged request once the quiet
// period or the cap has passed, with at most one push in flight: requests that arrive during
// a push are merged and pushed after it returns. It returns when ctx ends, after the push
// in flight (if any) has returned. debounced, if set, receives the time each merged request
// spent waiting (pilot_debounce_time).
func Debounce(ctx context.Context, in <-chan *Request, opts DebounceOptions, push func(context.Context, *Request), debounced func(time.Duration)) {
	clk := opts.clock
	if clk == nil {
		clk = wallClock{}
	}
	var (
		pending      *Request
		firstArrival time.Time
		lastArrival  time.Time
		t            timer
		timerC       <-chan time.Time
		free         = true
		done         = make(chan struct{}, 1)
	)
	// arm replaces the timer: one wake-up is pending at a time.
	arm := func(d time.Duration) {
		if t != nil {
			t.Stop()
		}
		t = clk.NewTimer(d)
		timerC = t.C()
	}
	start := func(r *Request) {
		free = false
		go func() {
			push(ctx, r)
			done <- struct{}{}
		}()
	}
	tryPush := func() {
		if pending == nil || !free {
			return
		}
		now := clk.Now()
		quiet := now.Sub(lastArrival)
		waited := now.Sub(firstArrival)
		if quiet >= opts.After || waited >= opts.Max {
			if debounced != nil {
				debounced(waited)
			}
			r := pending
			pending = nil
			start(r)
			return
		}
		// Wake when the quiet period would end, or at the cap, whichever is first.
		wait := opts.After - quiet
		if rest := opts.Max - waited; rest < wait {
			wait = rest
		}
		arm(wait)
	}
	defer func() {
		if t != nil {
			t.Stop()
		}
		if !free {
			<-done
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-in:
			if r == nil {
				continue
			}
			if !r.Full && !opts.EnableEDS {
				// Endpoint changes skip the debounce; they still wait for a push in flight.
				if free && pending == nil {
					start(r)
					continue
				}
			}
			now := clk.Now()
			if pending == nil {
				firstArrival = now
			}
			lastArrival = now
			pending = pending.Merge(r)
			if opts.After <= 0 {
				tryPush()
				continue
			}
			if timerC == nil {
				wait := opts.After
				if opts.Max < wait {
					wait = opts.Max
				}
				arm(wait)
			}
		case <-timerC:
			timerC = nil
			tryPush()
		case <-done:
			free = true
			tryPush()
		}
	}
}
