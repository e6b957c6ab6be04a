// Command echo is the mesh's sample application (see package echo): it answers with who it
// is and what it received, and calls further services for each request.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/testenv/echo"
)

func main() {
	if err := command().Execute(); err != nil {
		os.Exit(1)
	}
}

func command() *cobra.Command {
	var (
		cfg           echo.Config
		listen        string
		shutdownDelay time.Duration
		grace         time.Duration
	)
	cmd := &cobra.Command{
		Use:          "echo",
		Short:        "The mesh's sample application: answers with who it is, calls further services",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srv, err := echo.New(cfg)
			if err != nil {
				return err
			}
			if err := srv.Start(cmd.Context()); err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("echo: listen on %s: %w", listen, err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("scope", "echo", "service", cfg.Service, "version", cfg.Version)
			log.Info("serving", "address", ln.Addr().String(), "calls", cfg.Calls)

			sigs, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				<-sigs.Done()
				// Keep serving a while after SIGTERM, as an application with a preStop
				// sleep does, so the sidecar can drain the requests still routed here.
				log.Info("terminating", "after", shutdownDelay)
				time.Sleep(shutdownDelay)
				cancel()
			}()
			err = srv.Serve(ctx, ln, grace)
			log.Info("stopped", "error", err)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", ":8080", "address to serve on")
	f.StringVar(&cfg.Service, "service", "echo", "service name reported in answers")
	f.StringVar(&cfg.Version, "version", "v1", "version reported in answers")
	f.StringVar(&cfg.Pod, "pod", os.Getenv("POD_NAME"), "pod name reported in answers (default $POD_NAME)")
	f.StringArrayVar(&cfg.Calls, "call", nil, "URL to call for every request to / (repeatable)")
	f.StringVar(&cfg.OutboundAddress, "outboundAddress", "", "send calls to this IP (the sidecar's outbound listeners) instead of the URL's host")
	f.BoolVar(&cfg.TCP, "tcp", false, "serve the line echo protocol over TCP instead of HTTP (a TCP service)")
	f.IntVar(&cfg.FailEvery, "failEvery", 0, "answer 503 to every Nth request")
	f.DurationVar(&cfg.Delay, "delay", 0, "delay every answer")
	f.StringVar(&cfg.StartupCall, "startupCall", "", "URL called once before serving; the application fails to start if the call fails")
	f.DurationVar(&cfg.CallTimeout, "callTimeout", 10*time.Second, "timeout of each call")
	f.DurationVar(&shutdownDelay, "shutdownDelay", 0, "keep serving this long after SIGTERM")
	f.DurationVar(&grace, "grace", 10*time.Second, "how long requests in flight may take to finish at shutdown")
	return cmd
}
