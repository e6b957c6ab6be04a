// Package service answers Envoy's rate-limit API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the config of
// ratelimit/config and fixed-window counters in Redis (ratelimit/redisstore).
package service

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/wasmesh/wasmesh/controlplane/dirwatch"
	"github.com/wasmesh/wasmesh/controlplane/ratelimit/config"
	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redisstore"
)

// Options tune a Service.
type Options struct {
	// Timeout bounds a decision's Redis round trip; past it the domain's failure policy answers.
	Timeout time.Duration
	// NearLimitRatio is the share of a limit past which hits count as near_limit (0.8 as the
	// reference service when zero).
	NearLimitRatio float64
	// NoLocalCache sends every hit to Redis, even on keys known over the limit.
	NoLocalCache bool
	Log          *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Service implements rlv3.RateLimitServiceServer.
type Service struct {
	rlv3.UnimplementedRateLimitServiceServer
	opts    Options
	store   *redisstore.Store
	metrics *Metrics
	cache   *overCache
	cfg     atomic.Pointer[config.Config]
	// loadErr is the last load's error (nil after a good load).
	loadErr atomic.Pointer[error]
}

// New returns a Service with an empty config (every descriptor unlimited) until SetConfig.
func New(store *redisstore.Store, m *Metrics, o Options) *Service {
	if o.Timeout <= 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if o.NearLimitRatio <= 0 {
		o.NearLimitRatio = 0.8
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Service{opts: o, store: store, metrics: m}
	if !o.NoLocalCache {
		s.cache = newOverCache()
	}
	return s
}

// SetConfig puts cfg in force for the following requests.
func (s *Service) SetConfig(cfg *config.Config) { s.cfg.Store(cfg) }

// Config is the config in force (nil before the first SetConfig).
func (s *Service) Config() *config.Config { return s.cfg.Load() }

// WatchConfig loads dir now and on every change until ctx ends. A load that fails (a bad
// file) is logged with the file, path and reason, counted, and leaves the last good config
// in force. It returns the first load's error, if any, through first (called once).
func (s *Service) WatchConfig(ctx context.Context, dir string, first func(error)) error {
	once := first
	return dirwatch.Run(ctx, dir, s.opts.Log, func() {
		err := s.Reload(dir)
		if once != nil {
			once(err)
			once = nil
		}
	})
}

// Reload reads dir and, if every file is good, puts it in force.
func (s *Service) Reload(dir string) error {
	cfg, err := config.Load(dir)
	if err != nil {
		s.metrics.ConfigLoad.WithLabelValues("error").Inc()
		s.opts.Log.Error("rate-limit config rejected; the last good config stays in force", "dir", dir, "error", err)
		s.loadErr.Store(&err)
		return err
	}
	s.metrics.ConfigLoad.WithLabelValues("success").Inc()
	s.SetConfig(cfg)
	s.loadErr.Store(nil)
	s.opts.Log.Info("rate-limit config loaded", "dir", dir, "domains", len(cfg.Domains))
	return nil
}

// decision is one request descriptor on its way to an answer.
type decision struct {
	match   *config.Match
	hits    uint64
	key     string // the counter: domain, entries, window start
	window  time.Duration
	reset   time.Duration
	cached  bool // over the limit per the local cache
	counter int  // index in the Redis pipeline, or -1
}

// ShouldRateLimit answers one request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlv3.RateLimitRequest) (*rlv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	cfg := s.cfg.Load()
	if cfg == nil {
		return nil, status.Error(codes.Unavailable, "no rate-limit configuration loaded yet")
	}
	now := s.opts.Now()
	ds, incs := s.plan(cfg, req, now)
	var counts []uint64
	var redisErr error
	if len(incs) > 0 {
		rctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		start := time.Now()
		counts, redisErr = s.store.Incr(rctx, incs)
		cancel()
		s.metrics.RedisLatency.Observe(time.Since(start).Seconds())
		if redisErr != nil {
			s.metrics.RedisErrors.Inc()
			if ctx.Err() != nil { // the caller went away: nobody reads a policy answer
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	resp := &rlv3.RateLimitResponse{OverallCode: rlv3.RateLimitResponse_OK}
	var deny bool
	if redisErr != nil {
		deny = cfg.Domains[req.Domain] != nil && cfg.Domains[req.Domain].FailureModeDeny
		policy := "open"
		if deny {
			policy = "closed"
		}
		s.metrics.FailurePolicy.WithLabelValues(req.Domain, policy).Inc()
		s.opts.Log.Warn("redis failed; answering by the domain's failure policy", "domain", req.Domain, "policy", policy, "error", redisErr)
	}
	for _, d := range ds {
		st := s.judge(d, counts, redisErr != nil, deny, now)
		if st.Code == rlv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlv3.RateLimitResponse_OVER_LIMIT
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

// plan finds each descriptor's limit and counter and the Redis increments to send.
func (s *Service) plan(cfg *config.Config, req *rlv3.RateLimitRequest, now time.Time) ([]decision, []redisstore.Incr) {
	ds := make([]decision, len(req.Descriptors))
	var incs []redisstore.Incr
	entries := make([]config.Entry, 0, 4)
	for i, rd := range req.Descriptors {
		d := &ds[i]
		d.counter = -1
		d.hits = uint64(req.HitsAddend)
		if h := rd.GetHitsAddend(); h != nil {
			d.hits = h.GetValue()
		}
		if d.hits == 0 {
			d.hits = 1
		}
		entries = entries[:0]
		for _, e := range rd.Entries {
			entries = append(entries, config.Entry{Key: e.Key, Value: e.Value})
		}
		d.match = limitOf(cfg, req.Domain, rd, entries)
		if d.match == nil || d.match.Unlimited {
			continue
		}
		d.window = config.Window(d.match.Unit)
		start := now.Truncate(d.window)
		d.reset = start.Add(d.window).Sub(now)
		d.key = counterKey(req.Domain, entries, start)
		s.metrics.TotalHits.WithLabelValues(d.match.MetricKey).Add(float64(d.hits))
		if s.cache != nil && s.cache.over(d.key, now) {
			d.cached = true
			continue
		}
		d.counter = len(incs)
		incs = append(incs, redisstore.Incr{Key: d.key, Hits: d.hits, Expire: d.window})
	}
	return ds, incs
}

// limitOf is the configured limit, or the request's own override (descriptor.limit), which
// the reference service honours the same way: never in shadow mode.
func limitOf(cfg *config.Config, domain string, rd *rlcommon.RateLimitDescriptor, entries []config.Entry) *config.Match {
	if o := rd.GetLimit(); o != nil {
		u := rlv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())
		if config.Window(u) == 0 {
			return nil
		}
		l := &config.Limit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u, Key: domain + ".override"}
		return &config.Match{Limit: l, MetricKey: l.Key}
	}
	return cfg.Find(domain, entries)
}

// counterKey is domain_key_value_..._windowstart, as the reference service's cache keys.
func counterKey(domain string, entries []config.Entry, start time.Time) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte('_')
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
	}
	b.WriteByte('_')
	b.WriteString(strconv.FormatInt(start.Unix(), 10))
	return b.String()
}

// judge turns a descriptor's count into its status and metrics, with the reference
// service's accounting of over_limit, near_limit and shadow_mode hits.
func (s *Service) judge(d decision, counts []uint64, failed, deny bool, now time.Time) *rlv3.RateLimitResponse_DescriptorStatus {
	if d.match == nil {
		return &rlv3.RateLimitResponse_DescriptorStatus{Code: rlv3.RateLimitResponse_OK}
	}
	if d.match.Unlimited {
		return &rlv3.RateLimitResponse_DescriptorStatus{Code: rlv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
	}
	limit := &rlv3.RateLimitResponse_RateLimit{
		RequestsPerUnit: d.match.RequestsPerUnit, Unit: d.match.Unit, Name: d.match.Name,
	}
	st := &rlv3.RateLimitResponse_DescriptorStatus{
		Code: rlv3.RateLimitResponse_OK, CurrentLimit: limit, DurationUntilReset: durationpb.New(d.reset),
	}
	key, m := d.match.MetricKey, s.metrics
	over := false
	switch {
	case d.cached:
		over = true
		m.OverLimit.WithLabelValues(key).Add(float64(d.hits))
		m.OverLimitWithLocalCache.WithLabelValues(key).Add(float64(d.hits))
	case failed:
		if deny && !d.match.ShadowMode { // a shadow limit never rejects
			st.Code = rlv3.RateLimitResponse_OVER_LIMIT
		} else {
			st.LimitRemaining = d.match.RequestsPerUnit
		}
		return st
	default:
		after := counts[d.counter]
		before := after - min(after, d.hits)
		lim := uint64(d.match.RequestsPerUnit)
		near := uint64(math.Floor(float64(lim) * s.opts.NearLimitRatio))
		if after > lim {
			over = true
			if before >= lim {
				m.OverLimit.WithLabelValues(key).Add(float64(d.hits))
			} else {
				m.OverLimit.WithLabelValues(key).Add(float64(after - lim))
				m.NearLimit.WithLabelValues(key).Add(float64(lim - max(near, before)))
			}
			if s.cache != nil {
				s.cache.add(d.key, now.Add(d.reset), now)
			}
		} else {
			st.LimitRemaining = uint32(lim - after)
			if after > near {
				m.NearLimit.WithLabelValues(key).Add(float64(after - max(near, before)))
			}
			m.WithinLimit.WithLabelValues(key).Add(float64(d.hits))
		}
	}
	if over {
		st.Code = rlv3.RateLimitResponse_OVER_LIMIT
		if d.match.ShadowMode {
			st.Code = rlv3.RateLimitResponse_OK
			m.ShadowMode.WithLabelValues(key).Add(float64(d.hits))
		}
	}
	return st
}

// LoadError is why the last config load was rejected, or nil when it was good.
func (s *Service) LoadError() error {
	if p := s.loadErr.Load(); p != nil {
		return *p
	}
	return nil
}

// ErrNoConfig is returned by Ready before a config is in force.
var ErrNoConfig = errors.New("no rate-limit config loaded yet")

// Ready reports whether a config is in force (the health check).
func (s *Service) Ready() error {
	if s.cfg.Load() == nil {
		return ErrNoConfig
	}
	return nil
}
