// Command testproxy is a small stand-in for Envoy used by the agent's tests: it accepts
// Envoy's command line, reads the bootstrap for the admin address, the static listeners
// (the readiness and Prometheus listeners route by path prefix to static clusters) and
// stats_tags, serves the admin calls the agent makes, and does a hot restart between
// epochs through a Unix socket next to the bootstrap file. It has no xDS; tests stand in
// for discovery with POST /testproxy/xds on its admin, and read the admin calls the agent
// made with GET /testproxy/admin_posts. Knobs (environment):
//
//	TESTPROXY_EXIT_CODE=n        exit with n right after start (a proxy that cannot start)
//	TESTPROXY_FAIL_FILE=path     the file holds a count k; while k>0, decrement it and exit 1
//	TESTPROXY_STARTS_FILE=path   append "<epoch> <pid> <unix nanos>" on each start
//	TESTPROXY_CONFIG_ON_START=1  behave as if the first xDS config arrived at start
//	TESTPROXY_SERIES=n           expose n synthetic istio_requests_total series
//	TESTPROXY_CHILD_INIT=dur     an epoch after the first stays INITIALIZING (no config yet)
//	                             for dur, then goes LIVE and tells its parent to drain
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	config         string
	epoch          int
	drainTime      time.Duration
	parentShutdown time.Duration
	serviceCluster string
	serviceNode    string
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("testproxy", flag.ContinueOnError)
	fs.StringVar(&o.config, "c", "", "bootstrap file")
	fs.IntVar(&o.epoch, "restart-epoch", 0, "hot restart epoch")
	drain := fs.Int("drain-time-s", 600, "drain time in seconds")
	parent := fs.Int("parent-shutdown-time-s", 900, "parent shutdown time in seconds")
	fs.StringVar(&o.serviceCluster, "service-cluster", "", "")
	fs.StringVar(&o.serviceNode, "service-node", "", "")
	fs.String("local-address-ip-version", "v4", "")
	fs.String("log-level", "info", "")
	fs.String("l", "info", "")
	fs.String("component-log-level", "", "")
	fs.Int("concurrency", 0, "")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.config == "" {
		return o, errors.New("-c <bootstrap> is required")
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	o.drainTime = time.Duration(*drain) * time.Second
	o.parentShutdown = time.Duration(*parent) * time.Second
	return o, nil
}

func main() {
	log.SetPrefix(fmt.Sprintf("testproxy[%d] ", os.Getpid()))
	log.SetFlags(log.Lmicroseconds)
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		log.Printf("bad command line: %v", err)
		os.Exit(1)
	}
	if f := os.Getenv("TESTPROXY_STARTS_FILE"); f != "" {
		if err := appendLine(f, fmt.Sprintf("%d %d %d\n", o.epoch, os.Getpid(), time.Now().UnixNano())); err != nil {
			log.Printf("starts file: %v", err)
		}
	}
	if code := os.Getenv("TESTPROXY_EXIT_CODE"); code != "" {
		n, _ := strconv.Atoi(code)
		log.Printf("exiting with %d as TESTPROXY_EXIT_CODE asks", n)
		os.Exit(n)
	}
	if f := os.Getenv("TESTPROXY_FAIL_FILE"); f != "" {
		if failNow(f) {
			log.Printf("failing this start as %s asks", f)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	code, err := run(ctx, o)
	if err != nil {
		log.Printf("error: %v", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func run(ctx context.Context, o options) (int, error) {
	raw, err := os.ReadFile(o.config)
	if err != nil {
		return 1, err
	}
	var bs bootstrapDoc
	if err := json.Unmarshal(raw, &bs); err != nil {
		return 1, fmt.Errorf("bootstrap %s: %w", o.config, err)
	}
	p, err := newProxy(o, bs, raw)
	if err != nil {
		return 1, err
	}
	return p.serve(ctx)
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(line)
	return err
}

// failNow decrements the count in path and reports whether this start must fail.
func failNow(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return false
	}
	_ = os.WriteFile(path, []byte(strconv.Itoa(n-1)), 0o644)
	return true
}

func socketPath(o options, epoch int) string {
	return filepath.Join(filepath.Dir(o.config), fmt.Sprintf("hr%d.sock", epoch))
}
