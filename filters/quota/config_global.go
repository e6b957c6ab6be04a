package main

import (
	"fmt"
	"math"
	"time"

	"github.com/wasmesh/wasmesh/filters/internal/ratelimit"
)

// serviceConfig is "rate_limit_service": where global descriptors are decided, with the
// settings of Envoy's envoy.filters.http.ratelimit that apply to a filter whose
// descriptors are its own (Envoy's "stage" selects route rate_limits actions, which this
// filter has none of).
type serviceConfig struct {
	Cluster         string `json:"cluster"`
	Authority       string `json:"authority"`
	Domain          string `json:"domain"`
	Timeout         string `json:"timeout"`
	FailureModeDeny bool   `json:"failure_mode_deny"`
	StatusOnError   *int64 `json:"status_on_error"`
	RequestType     string `json:"request_type"`
}

// mode is where a descriptor is decided.
type mode uint8

const (
	modeLocal  mode = iota // this proxy's buckets only
	modeGlobal             // the rate-limit service only
	modeBoth               // a local bucket first; what it allows goes to the service
)

// requestType is Envoy's request_type: which requests the service is asked about, by
// x-envoy-internal.
type requestType uint8

const (
	requestBoth requestType = iota
	requestInternal
	requestExternal
)

// Envoy's defaults: a 20 ms timeout and 500 when the service fails and the filter
// fails closed.
const (
	defaultServiceTimeout = 20 * time.Millisecond
	defaultStatusOnError  = 500
)

// service is a validated rate_limit_service.
type service struct {
	cluster         string
	authority       string
	grpcService     []byte // GrpcService{envoy_grpc{cluster_name, authority}}, proxy_grpc_call's target
	domain          string
	timeout         time.Duration // 0: none
	failureModeDeny bool
	statusOnError   uint32
	requestType     requestType
}

func parseMode(path, s string) (mode, error) {
	switch s {
	case "", "local":
		return modeLocal, nil
	case "global":
		return modeGlobal, nil
	case "both":
		return modeBoth, nil
	}
	return 0, fieldError(path, `unknown mode %q; one of "local", "global", "both"`, s)
}

func (m mode) String() string {
	return [...]string{"local", "global", "both"}[m]
}

// checkMode checks the descriptor's limit (p, nil when none is given) and entries
// against its mode.
func (d *descriptor) checkMode(path string, p *ratelimit.Policy) error {
	switch {
	case d.mode == modeGlobal && p != nil:
		return fieldError(path, `a limit is not used in mode "global": the rate-limit service holds it; remove "token_bucket"/"quota" or use mode "both"`)
	case d.mode != modeGlobal && p == nil:
		if d.mode == modeBoth {
			return fieldError(path, `mode "both" needs the local bucket: one of "token_bucket" and "quota" is required`)
		}
		return fieldError(path, `one of "token_bucket" and "quota" is required`)
	case d.mode != modeLocal && len(d.entries) == 0:
		return fieldError(path+".entries", `mode %q needs at least one entry: the rate-limit service matches descriptors by their entries (a fixed one has source "generic_key")`, d.mode)
	}
	return nil
}

// validateService checks rate_limit_service against the descriptors: present exactly
// when some descriptor asks the service.
func (c *config) validateService(s *settings) error {
	global := -1
	for i, d := range s.descriptors {
		if d.mode != modeLocal {
			global = i
			break
		}
	}
	switch {
	case c.RateLimitService == nil && global >= 0:
		return fieldError(fmt.Sprintf("descriptors[%d].mode", global), `%q needs "rate_limit_service"`, s.descriptors[global].mode)
	case c.RateLimitService == nil:
		return nil
	case global < 0:
		return fieldError("rate_limit_service", `not used: no descriptor has mode "global" or "both"`)
	}
	svc, err := c.RateLimitService.validate("rate_limit_service")
	if err != nil {
		return err
	}
	s.service = svc
	return nil
}

func (sc *serviceConfig) validate(path string) (*service, error) {
	svc := &service{cluster: sc.Cluster, domain: sc.Domain, timeout: defaultServiceTimeout,
		failureModeDeny: sc.FailureModeDeny, statusOnError: defaultStatusOnError}
	if sc.Cluster == "" {
		return nil, fieldError(path+".cluster", "required: the Envoy cluster of the rate-limit service")
	}
	for i := 0; i < len(sc.Authority); i++ {
		if c := sc.Authority[i]; c < 0x21 || c == 0x7f {
			return nil, fieldError(path+".authority", "%q is not a host name: byte %d is 0x%02x", sc.Authority, i, c)
		}
	}
	svc.authority = sc.Authority
	// The target goes as a GrpcService, the form Envoy parses first, so that no cluster
	// name can be mistaken for one.
	svc.grpcService = appendGrpcService(nil, sc.Cluster, sc.Authority)
	if sc.Domain == "" {
		return nil, fieldError(path+".domain", "required: the domain of the service's configuration")
	}
	switch sc.Timeout {
	case "":
	case "0", "0s": // Envoy's 0: no timeout
		svc.timeout = 0
	default:
		d, err := parseDuration(path+".timeout", sc.Timeout)
		if err != nil {
			return nil, err
		}
		if d%time.Millisecond != 0 || d > time.Duration(math.MaxUint32)*time.Millisecond {
			return nil, fieldError(path+".timeout", "%q must be whole milliseconds, at most %v", sc.Timeout, time.Duration(math.MaxUint32)*time.Millisecond)
		}
		svc.timeout = d
	}
	if sc.StatusOnError != nil {
		if n := *sc.StatusOnError; n < 400 || n > 599 {
			return nil, fieldError(path+".status_on_error", "must be an HTTP error status, 400 to 599, got %d", n)
		}
		svc.statusOnError = uint32(*sc.StatusOnError)
	}
	switch sc.RequestType {
	case "", "both":
	case "internal":
		svc.requestType = requestInternal
	case "external":
		svc.requestType = requestExternal
	default:
		return nil, fieldError(path+".request_type", `unknown request type %q; one of "internal", "external", "both"`, sc.RequestType)
	}
	return svc, nil
}
