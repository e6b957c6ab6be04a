// Package meshrunner holds what the commands that run a mesh for a person (meshrun,
// meshrun-k8s) and the tests' steady load share: signals and directories, the steady
// traffic to the front end, and the live summary's loop and load line.
package meshrunner

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/wasmesh/wasmesh/testenv/loadgen"
)

// Setup returns a context that ends on SIGINT or SIGTERM, ignores SIGPIPE (a closed output,
// `make run | tee run.log` with tee gone at Ctrl-C, must not kill a runner before it has
// stopped its mesh: writes fail instead), makes dir and paths absolute and removes dir (the
// run's directory, made anew).
func Setup(dir *string, paths ...*string) (context.Context, context.CancelFunc, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	signal.Ignore(syscall.SIGPIPE)
	for _, p := range append([]*string{dir}, paths...) {
		abs, err := filepath.Abs(*p)
		if err != nil {
			stop()
			return nil, nil, err
		}
		*p = abs
	}
	if err := os.RemoveAll(*dir); err != nil {
		stop()
		return nil, nil, err
	}
	return ctx, stop, nil
}

// StartLoad sends GET url at rate (requests per second, at most 32 in flight) until ctx
// ends or the load is stopped; an answer other than 200 is a failure.
func StartLoad(ctx context.Context, url string, rate float64) (*loadgen.Generator, error) {
	return loadgen.Start(ctx, loadgen.Config{Rate: rate, Concurrency: 32,
		Request: func(int) (*http.Request, error) { return http.NewRequest(http.MethodGet, url, nil) },
		Failed:  func(status int) bool { return status != http.StatusOK }})
}

// Summarize calls screen with the load's snapshot at the last and at this interval, every
// interval, until ctx ends (or once), then stops the load and prints its totals.
func Summarize(ctx context.Context, out io.Writer, load *loadgen.Generator, interval time.Duration, once bool, screen func(prev, cur loadgen.Result)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	prev := load.Snapshot()
	for {
		select {
		case <-ctx.Done():
			res := load.Stop()
			fmt.Fprintf(out, "\nload: %s\n", res.String())
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // both were ready: stopping goes first
			continue
		}
		cur := load.Snapshot()
		screen(prev, cur)
		prev = cur
		if once {
			res := load.Stop()
			fmt.Fprintf(out, "\nload: %s\n", res.String())
			return
		}
	}
}

// LoadLine is the summary's first line: the time, the rate and errors over the interval,
// the totals and the latency quantiles.
func LoadLine(prev, cur loadgen.Result) string {
	secs := (cur.Elapsed - prev.Elapsed).Seconds()
	done := (cur.Succeeded + cur.Failed) - (prev.Succeeded + prev.Failed)
	failed := cur.Failed - prev.Failed
	errRate := 0.0
	if done > 0 {
		errRate = 100 * float64(failed) / float64(done)
	}
	return fmt.Sprintf("%s  %.1f req/s  errors %.1f%%  (total %d, failed %d)  p50 %v  p99 %v",
		time.Now().Format("15:04:05"), float64(done)/secs, errRate, cur.Succeeded+cur.Failed, cur.Failed,
		cur.Quantile(0.5).Round(10*time.Microsecond), cur.Quantile(0.99).Round(10*time.Microsecond))
}
