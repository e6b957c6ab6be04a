// Package redisstore keeps the rate-limit service's fixed-window counters in Redis: one
// pipeline of INCRBY and EXPIRE per request, over a go-redis UniversalClient (a single
// server, Sentinel or Cluster).
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options says where Redis is.
type Options struct {
	// Addrs is a comma-separated list of host:port, or "master@host:port,host:port" for the
	// Sentinels of a master (as Envoy's reference service's REDIS_URL with REDIS_TYPE=sentinel).
	Addrs string
	// MasterName, when set, names the Sentinel master (Addrs are then the Sentinels).
	MasterName string
	// Cluster says Addrs are nodes of a Redis Cluster (implied by more than one address without
	// a master name).
	Cluster  bool
	Password string
	// Timeout bounds dialing and each read or write; a request's context may bound it more.
	Timeout  time.Duration
	PoolSize int
}

// Store is a counter store. It is safe for concurrent use.
type Store struct {
	client     redis.UniversalClient
	roundTrips atomic.Uint64
}

// ParseAddrs splits "master@host:port,host:port" into the master name and addresses.
func ParseAddrs(s string) (master string, addrs []string, err error) {
	if m, rest, ok := strings.Cut(s, "@"); ok {
		if m == "" {
			return "", nil, fmt.Errorf("redis address %q: empty Sentinel master name before @", s)
		}
		master, s = m, rest
	}
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if !strings.Contains(a, ":") {
			return "", nil, fmt.Errorf("redis address %q: want host:port", a)
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return "", nil, fmt.Errorf("redis address %q: no host:port", s)
	}
	return master, addrs, nil
}

// New connects lazily (the first command dials).
func New(o Options) (*Store, error) {
	master, addrs, err := ParseAddrs(o.Addrs)
	if err != nil {
		return nil, err
	}
	if o.MasterName != "" {
		if master != "" && master != o.MasterName {
			return nil, fmt.Errorf("redis address names master %q but the master name is %q", master, o.MasterName)
		}
		master = o.MasterName
	}
	if master != "" && o.Cluster {
		return nil, errors.New("redis: a Sentinel master and Cluster mode exclude each other")
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	uo := &redis.UniversalOptions{
		Addrs:                 addrs,
		MasterName:            master,
		IsClusterMode:         o.Cluster,
		Password:              o.Password,
		DialTimeout:           o.Timeout,
		ReadTimeout:           o.Timeout,
		WriteTimeout:          o.Timeout,
		ContextTimeoutEnabled: true,
		// A decision has one chance within its timeout: the failure policy answers, not a retry.
		MaxRetries:    -1,
		DialerRetries: 1,
		PoolSize:      o.PoolSize,
	}
	return &Store{client: redis.NewUniversalClient(uo)}, nil
}

// Close closes the connections.
func (s *Store) Close() error { return s.client.Close() }

// RoundTrips counts the pipelines sent (one per Incr call with something to count).
func (s *Store) RoundTrips() uint64 { return s.roundTrips.Load() }

// Incr is one counter to raise.
type Incr struct {
	Key    string
	Hits   uint64
	Expire time.Duration
}

// Incr raises every counter by its hits and sets its expiry, all in one pipeline, and
// returns the counters after the increase in the same order.
func (s *Store) Incr(ctx context.Context, incs []Incr) ([]uint64, error) {
	if len(incs) == 0 {
		return nil, nil
	}
	s.roundTrips.Add(1)
	pipe := s.client.Pipeline()
	cmds := make([]*redis.IntCmd, len(incs))
	for i, in := range incs {
		cmds[i] = pipe.IncrBy(ctx, in.Key, int64(in.Hits))
		pipe.Expire(ctx, in.Key, in.Expire)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("redis pipeline: %w", err)
	}
	out := make([]uint64, len(incs))
	for i, c := range cmds {
		out[i] = uint64(c.Val())
	}
	return out, nil
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error { return s.client.Ping(ctx).Err() }
