package server

import (
	"context"
	"time"
)

// shutdownGrace is how long in-flight requests get when the process is told to stop
// (SIGTERM, /quitquitquit); Envoy exits at once, a short grace keeps tests' requests whole.
const shutdownGrace = time.Second

// Run builds, starts and runs a server until ctx ends or /quitquitquit.
func Run(ctx context.Context, o Options, exts ...Extension) error {
	s, err := New(ctx, o, append(DefaultExtensions(), exts...)...)
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		s.Cancel()
		return err
	}
	select {
	case <-ctx.Done():
	case <-s.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	s.Shutdown(sctx)
	return nil
}

// DefaultExtensions are the extensions every meshproxy has.
func DefaultExtensions() []Extension { return []Extension{wasmExtension} }
