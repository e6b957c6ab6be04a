package server

import (
	"context"
	"net"
	"time"

	"github.com/wasmesh/wasmesh/testenv/proxy/hotrestart"
)

// shutdownGrace is how long in-flight requests get when the process is told to stop
// (SIGTERM, /quitquitquit, the end of a hot-restart parent); Envoy exits at once, a short
// grace keeps requests in flight whole.
const shutdownGrace = time.Second

// Run builds, starts and runs a server until ctx ends or it is told to quit. With
// --restart-epoch > 0 it first takes the listening sockets of the previous epoch of the
// same --base-id; it always offers its own to the next epoch.
func Run(ctx context.Context, o Options, exts ...Extension) error {
	// The server's own context ends with Shutdown, not with ctx: connections, clusters and
	// listeners live through the grace that follows the signal.
	s, err := New(context.WithoutCancel(ctx), o, append(DefaultExtensions(), exts...)...)
	if err != nil {
		return err
	}
	parent, err := hotrestart.Connect(o.BaseID, o.RestartEpoch)
	if err != nil {
		s.log.Warn("hot restart: previous epoch unusable, starting fresh", "err", err)
	}
	if parent != nil {
		s.SetHotRestartParent(parent)
		s.log.Info("hot restart: took the previous epoch's sockets", "epoch", o.RestartEpoch)
	}
	if err := s.Start(); err != nil {
		s.Cancel()
		return err
	}
	if err := hotrestart.Serve(s.ctx, o.BaseID, o.RestartEpoch, hotRestartProvider{s}); err != nil {
		s.log.Warn("hot restart: cannot offer sockets to the next epoch", "err", err)
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

// hotRestartProvider is the server as the next epoch sees it.
type hotRestartProvider struct{ s *Server }

func (p hotRestartProvider) Sockets() map[string]net.Listener {
	if p.s.listeners == nil {
		return map[string]net.Listener{}
	}
	return p.s.listeners.Sockets()
}

func (p hotRestartProvider) AdminListener() net.Listener { return p.s.adminLis }

func (p hotRestartProvider) ShutdownAdmin() { p.s.CloseAdmin() }

// Drain is Envoy's parent drain: stop accepting (the child accepts on the same sockets),
// stop serving the admin port (already done if the child took it, see ShutdownAdmin),
// tell connections to go away per the drain strategy, and exit after
// --parent-shutdown-time-s.
func (p hotRestartProvider) Drain() {
	s := p.s
	s.log.Info("hot restart: draining for the next epoch", "drain_time", s.opts.DrainTime, "parent_shutdown_time", s.opts.ParentShutdownTime)
	s.listeners.StopAccepting()
	s.CloseAdmin()
	s.serverDrain.Start()
	go func() {
		select {
		case <-time.After(s.opts.ParentShutdownTime):
			s.Quit()
		case <-s.ctx.Done():
		}
	}()
}

func (p hotRestartProvider) Terminate() { p.s.Quit() }

// DefaultExtensions are the extensions every meshproxy has.
func DefaultExtensions() []Extension { return []Extension{wasmExtension, httpFiltersExtension} }
