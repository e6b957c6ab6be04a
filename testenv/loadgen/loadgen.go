// Package loadgen sends HTTP traffic for the local mesh and its tests: at a fixed rate (open
// loop, so a slow server does not slow the offered load) or from a number of workers
// (closed loop), for a count or a duration, and counts what came back: statuses, transport
// errors, a class per response (for example the version that answered) and latencies.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Config describes a load.
type Config struct {
	// Rate is requests per second (open loop); 0 runs Concurrency workers back to back.
	Rate float64
	// Concurrency is the number of workers (closed loop) or the most requests in flight
	// (open loop; when reached, sending waits and the schedule slips). Default 16.
	Concurrency int
	// Requests stops after this many requests; Duration after this long. With neither,
	// the load runs until its context ends.
	Requests int
	Duration time.Duration
	// Request builds request i. Required.
	Request func(i int) (*http.Request, error)
	// Client sends the requests; nil means a client with keep-alive and a 10 s timeout.
	Client *http.Client
	// Classify, if set, names a class for each response (counted in Result.Classes).
	Classify func(resp *http.Response, body []byte) string
	// Failed says whether a response counts as failed; nil means status >= 500.
	Failed func(status int) bool
}

// Result is what a load observed.
type Result struct {
	Sent, Succeeded, Failed int
	// Status counts responses by status code; Errors counts transport errors by message.
	Status map[int]int
	Errors map[string]int
	// Classes counts responses by Config.Classify.
	Classes map[string]int
	// Elapsed is the time from the first request to the last answer.
	Elapsed time.Duration
	// latencies are a uniform sample of the responses' latencies (every one up to
	// maxSamples), sorted by Quantile.
	latencies []time.Duration
	seen      int
}

const maxSamples = 100_000

// Quantile returns the q-quantile (0..1) of the sampled latencies.
func (r *Result) Quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

// Fraction is the share of answered requests in class c.
func (r *Result) Fraction(class string) float64 {
	n := 0
	for _, v := range r.Classes {
		n += v
	}
	if n == 0 {
		return 0
	}
	return float64(r.Classes[class]) / float64(n)
}

// String summarises the result on one line.
func (r *Result) String() string {
	return fmt.Sprintf("sent %d, ok %d, failed %d, statuses %v, errors %v, p50 %v, p99 %v",
		r.Sent, r.Succeeded, r.Failed, r.Status, r.Errors, r.Quantile(0.5), r.Quantile(0.99))
}

func (r *Result) clone() Result {
	c := *r
	c.Status = cloneMap(r.Status)
	c.Errors = cloneMap(r.Errors)
	c.Classes = cloneMap(r.Classes)
	c.latencies = slices.Clone(r.latencies)
	return c
}

func cloneMap[K comparable](m map[K]int) map[K]int {
	c := make(map[K]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Generator is a load running in the background.
type Generator struct {
	cfg    Config
	cancel context.CancelFunc
	done   chan struct{}
	start  time.Time

	mu  sync.Mutex
	res Result
}

// Start begins the load; it runs until its limits are reached, ctx ends or Stop.
func Start(ctx context.Context, cfg Config) (*Generator, error) {
	if cfg.Request == nil {
		return nil, errors.New("loadgen: Config.Request is required")
	}
	if cfg.Rate < 0 || cfg.Concurrency < 0 || cfg.Requests < 0 || cfg.Duration < 0 {
		return nil, errors.New("loadgen: rate, concurrency, requests and duration must not be negative")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 16
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second,
			Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency, IdleConnTimeout: 30 * time.Second}}
	}
	if cfg.Failed == nil {
		cfg.Failed = func(status int) bool { return status >= 500 }
	}
	var cancel context.CancelFunc
	if cfg.Duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	g := &Generator{cfg: cfg, cancel: cancel, done: make(chan struct{}), start: time.Now(),
		res: Result{Status: map[int]int{}, Errors: map[string]int{}, Classes: map[string]int{}}}
	go g.run(ctx)
	return g, nil
}

// Run sends a load and waits for it to finish. A load that reaches its count or duration
// is not an error; one cut short by ctx returns ctx's error with what it observed.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Requests == 0 && cfg.Duration == 0 {
		return nil, errors.New("loadgen: Run needs Requests or Duration")
	}
	g, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	<-g.done
	res := g.Snapshot()
	return &res, ctx.Err()
}

// Snapshot returns what the load observed so far.
func (g *Generator) Snapshot() Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.res.clone()
	select {
	case <-g.done:
	default:
		r.Elapsed = time.Since(g.start)
	}
	return r
}

// Stop ends the load, waits for the requests in flight and returns the result.
func (g *Generator) Stop() Result {
	g.cancel()
	<-g.done
	return g.Snapshot()
}

// Done is closed when the load has finished.
func (g *Generator) Done() <-chan struct{} { return g.done }

func (g *Generator) run(ctx context.Context) {
	defer close(g.done)
	defer g.cancel()
	var wg sync.WaitGroup
	slots := make(chan struct{}, g.cfg.Concurrency)
	var tick *time.Ticker
	if g.cfg.Rate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / g.cfg.Rate))
		defer tick.Stop()
	}
	for i := 0; g.cfg.Requests == 0 || i < g.cfg.Requests; i++ {
		if tick != nil {
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		req, err := g.cfg.Request(i)
		if err != nil {
			<-slots
			g.record(0, "", 0, fmt.Errorf("building request %d: %w", i, err))
			continue
		}
		g.mu.Lock()
		g.res.Sent++
		g.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			g.send(req)
		}()
	}
	wg.Wait()
	g.mu.Lock()
	g.res.Elapsed = time.Since(g.start)
	g.mu.Unlock()
}

func (g *Generator) send(req *http.Request) {
	begin := time.Now()
	resp, err := g.cfg.Client.Do(req)
	if err != nil {
		g.record(0, "", 0, err)
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		g.record(0, "", 0, fmt.Errorf("reading the body of a %d: %w", resp.StatusCode, err))
		return
	}
	class := ""
	if g.cfg.Classify != nil {
		class = g.cfg.Classify(resp, body)
	}
	g.record(resp.StatusCode, class, time.Since(begin), nil)
}

func (g *Generator) record(status int, class string, latency time.Duration, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := &g.res
	if err != nil {
		r.Failed++
		msg := err.Error()
		if len(msg) > 200 {
			msg = msg[:200]
		}
		r.Errors[msg]++
		return
	}
	r.Status[status]++
	if g.cfg.Failed(status) {
		r.Failed++
	} else {
		r.Succeeded++
	}
	if class != "" {
		r.Classes[class]++
	}
	r.seen++
	if len(r.latencies) < maxSamples {
		r.latencies = append(r.latencies, latency)
	} else if j := rand.IntN(r.seen); j < maxSamples {
		r.latencies[j] = latency
	}
}
