// Command meshproxy is wasmesh's Envoy stand-in: it takes Envoy's command line and a v3
// bootstrap, speaks ADS to the control plane, proxies HTTP/1.1 and HTTP/2 with the Wasm
// filters, and answers Envoy's admin API.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/testenv/proxy/server"
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newCommand() *cobra.Command {
	var o server.Options
	var drainS, parentS int
	cmd := &cobra.Command{
		Use:           "meshproxy",
		Short:         "An Envoy stand-in that speaks xDS, runs proxy-wasm filters and serves Envoy's admin API",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DrainTime = time.Duration(drainS) * time.Second
			o.ParentShutdownTime = time.Duration(parentS) * time.Second
			o.Stdout, o.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
			o.Test = server.TestHooksFromEnv()
			switch o.Mode {
			case "validate":
				if err := server.Validate(o); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "error initializing configuration '%s': %v\n", o.ConfigPath, err)
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "configuration '%s' OK\n", o.ConfigPath)
				return nil
			case "serve", "":
			default:
				err := fmt.Errorf("--mode %q: want serve or validate", o.Mode)
				fmt.Fprintln(cmd.ErrOrStderr(), err)
				return err
			}
			if o.ContentionProfiling {
				runtime.SetBlockProfileRate(10000) // one event per 10µs blocked
				runtime.SetMutexProfileFraction(10)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			if err := server.Run(ctx, o); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "meshproxy:", err)
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.ConfigPath, "config-path", "c", "", "path to the v3 bootstrap (JSON or YAML)")
	f.StringVar(&o.ConfigYAML, "config-yaml", "", "bootstrap as inline YAML (used when no --config-path)")
	f.StringVar(&o.Mode, "mode", "serve", "serve, or validate the bootstrap and exit")
	f.IntVar(&o.RestartEpoch, "restart-epoch", 0, "hot restart epoch")
	f.IntVar(&drainS, "drain-time-s", 600, "drain time in seconds")
	f.IntVar(&parentS, "parent-shutdown-time-s", 900, "seconds after which the previous epoch exits")
	f.StringVar(&o.DrainStrategy, "drain-strategy", "gradual", "gradual or immediate")
	f.StringVar(&o.ServiceCluster, "service-cluster", "", "node cluster (overrides the bootstrap's)")
	f.StringVar(&o.ServiceNode, "service-node", "", "node id (overrides the bootstrap's)")
	f.Uint64Var(&o.BaseID, "base-id", 0, "base id of the hot restart domain socket")
	f.StringVarP(&o.LogLevel, "log-level", "l", "info", "trace, debug, info, warning, error, critical, off")
	f.StringVar(&o.ComponentLogLevel, "component-log-level", "", "per component levels: upstream:debug,connection:trace")
	f.IntVar(&o.Concurrency, "concurrency", 0, "worker count (Wasm VM instances per plugin); 0: number of CPUs")
	f.StringVar(&o.AdminAddressPath, "admin-address-path", "", "write the bound admin address to this file")
	f.BoolVar(&o.ContentionProfiling, "contention-profiling", false, "record block and mutex profiles for /debug/pprof")
	f.StringVar(&o.LocalAddressIPVersion, "local-address-ip-version", "v4", "v4 or v6")
	return cmd
}
