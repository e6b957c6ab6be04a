// Command agent is the wasmesh node agent (pilot-agent's role): `agent proxy sidecar`
// runs beside a proxy, `agent wait` holds a pod's application until the proxy is ready,
// `agent request` calls the proxy's admin API, `agent version` prints the version.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wasmesh/wasmesh/agent/admin"
	"github.com/wasmesh/wasmesh/agent/certwatch"
	"github.com/wasmesh/wasmesh/agent/podinfo"
	"github.com/wasmesh/wasmesh/agent/sds"
	"github.com/wasmesh/wasmesh/agent/sidecar"
	"github.com/wasmesh/wasmesh/agent/wait"
	"github.com/wasmesh/wasmesh/agent/workloadcert"
	"github.com/wasmesh/wasmesh/agent/xdsproxy"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "0.1.0-dev"

func main() {
	if err := newRoot(os.Stdout, os.Stderr).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "agent",
		Short:         "wasmesh node agent: bootstraps and supervises the proxy beside a workload",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&logLevel, "log_output_level", "default:info", "agent log level, <scope>:<level> (debug, info, warn, error)")
	logger := func() (*slog.Logger, *slog.LevelVar, error) {
		lvl := logLevel
		if _, after, ok := strings.Cut(lvl, ":"); ok {
			lvl = after
		}
		var l slog.Level
		if err := l.UnmarshalText([]byte(lvl)); err != nil {
			return nil, nil, fmt.Errorf("--log_output_level: %w", err)
		}
		v := new(slog.LevelVar)
		v.Set(l)
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: v})), v, nil
	}
	root.AddCommand(newProxy(stdout, stderr, logger), newWait(stderr), newRequest(stdout), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(c *cobra.Command, _ []string) { fmt.Fprintln(stdout, "agent version", version) },
	})
	return root
}

func newProxy(stdout, stderr io.Writer, logger func() (*slog.Logger, *slog.LevelVar, error)) *cobra.Command {
	var o sidecar.Options
	var certDir string
	cmd := &cobra.Command{
		Use:   "proxy sidecar",
		Short: "Run the proxy beside a workload: bootstrap, supervise, serve status, drain on SIGTERM",
		Long:  sidecarHelp + "\n\n" + sidecar.XDSHelp + "\n\n" + sidecar.CertHelp,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 || args[0] != "sidecar" {
				return fmt.Errorf("want `agent proxy sidecar`, got %v", args)
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error {
			log, level, err := logger()
			if err != nil {
				return err
			}
			o.Env, o.Log, o.LogLevel, o.Version, o.Stdout, o.Stderr = os.Environ(), log, level, version, stdout, stderr
			if len(o.CertFiles) == 0 {
				o.CertFiles = sidecar.DefaultCertFiles(certDir)
			}
			a, err := sidecar.New(o)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return a.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.BinaryPath, "binaryPath", "", "path to the proxy binary (default: ProxyConfig binaryPath, /usr/local/bin/envoy)")
	f.StringVar(&o.ConfigPath, "configPath", "", "directory for the generated envoy-rev<N>.json (default: ProxyConfig configPath, /etc/istio/proxy)")
	f.StringVar(&o.ServiceCluster, "serviceCluster", "", "proxy service cluster (default <app label>.<namespace>)")
	f.StringVar(&o.DiscoveryAddress, "discoveryAddress", "", "xDS address host:port (default: ProxyConfig discoveryAddress)")
	f.DurationVar(&o.DrainDuration, "drainDuration", 0, "how long the old epoch drains in a hot restart (default: ProxyConfig drainDuration, 45s)")
	f.DurationVar(&o.ParentShutdownDuration, "parentShutdownDuration", 0, "when the old epoch is shut down in a hot restart (default: the drain duration plus 15s, 60s with Istio's drain)")
	f.StringVar(&o.ProxyLogLevel, "proxyLogLevel", "warning", "proxy log level")
	f.StringVar(&o.ProxyComponentLogLevel, "proxyComponentLogLevel", "misc:error", "proxy per-component log levels")
	f.IntVar(&o.Concurrency, "concurrency", 0, "proxy worker threads (default: ProxyConfig concurrency, 2)")
	f.IntVar(&o.StatusPort, "statusPort", 15020, "status server port")
	f.IntSliceVar(&o.ApplicationPorts, "applicationPorts", nil, "ports that must have a proxy listener before the pod is ready")
	f.StringVar(&o.TemplateFile, "templateFile", "", "Go template for the bootstrap (default: the built-in one)")
	f.StringVar(&o.PodInfoDir, "podInfoDir", podinfo.DefaultDir, "directory of the downward-API files labels and annotations")
	f.StringVar(&certDir, "certDir", "/etc/certs", "directory of cert-chain.pem, key.pem, root-cert.pem")
	f.StringSliceVar(&o.CertFiles, "certFiles", nil, "certificate files to watch (overrides --certDir)")
	f.DurationVar(&o.CertCheckInterval, "certCheckInterval", certwatch.DefaultInterval, "period of the certificate hash check")
	f.StringVar(&o.CredentialsDir, "credentialsDir", workloadcert.DefaultCredentialsDir, "mounted workload credentials served by SDS instead of a CSR, when present")
	f.StringVar(&o.SDSSocket, "sdsSocket", sds.DefaultSocketPath, "Unix socket where the agent serves SDS to the proxy")
	f.StringVar(&o.XDSSocket, "xdsSocket", xdsproxy.DefaultSocketPath, "Unix socket where the agent's XDS proxy serves the proxy's xDS streams")
	return cmd
}

func newWait(stderr io.Writer) *cobra.Command {
	var o wait.Options
	var timeoutSeconds, requestMillis, periodMillis int
	cmd := &cobra.Command{
		Use:   "wait",
		Short: "Wait until the proxy is ready (for a postStart hook)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			o.Timeout = time.Duration(timeoutSeconds) * time.Second
			o.RequestTimeout = time.Duration(requestMillis) * time.Millisecond
			o.Period = time.Duration(periodMillis) * time.Millisecond
			o.Log = stderr
			return wait.Run(c.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.URL, "url", wait.DefaultURL(), "readiness URL")
	f.IntVar(&timeoutSeconds, "timeoutSeconds", 60, "give up after this many seconds")
	f.IntVar(&requestMillis, "requestTimeoutMillis", 500, "timeout of one request")
	f.IntVar(&periodMillis, "periodMillis", 500, "time between requests")
	return cmd
}

func newRequest(stdout io.Writer) *cobra.Command {
	var adminAddr string
	cmd := &cobra.Command{
		Use:   "request <method> <path>",
		Short: "Make a request to the local proxy's admin API",
		Args:  cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			method := strings.ToUpper(args[0])
			switch method {
			case http.MethodGet, http.MethodPost:
			default:
				return fmt.Errorf("method %q: want GET or POST", args[0])
			}
			a := admin.New(adminAddr, 10*time.Second)
			defer a.Close()
			code, body, err := a.Do(c.Context(), method, args[1])
			if err != nil {
				return err
			}
			stdout.Write(body)
			if code >= 400 {
				return fmt.Errorf("%s %s: status %d", method, args[1], code)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&adminAddr, "adminAddress", defaultAdmin(), "proxy admin host:port")
	return cmd
}

func defaultAdmin() string {
	host := os.Getenv("WASMESH_LOCALHOST")
	if host == "" {
		host = "127.0.0.1"
	}
	return host + ":15000"
}

// sidecarHelp says what `agent proxy sidecar` reads besides its flags, as the injector
// sets it in a pod (docs/contracts.md has the details).
const sidecarHelp = `Run the proxy beside a workload: write the proxy's bootstrap, start and supervise the
proxy (hot restart on certificate change, restarts within a retry budget), serve the status
port (readiness, app probes, merged metrics), and drain the proxy on SIGTERM.

Where discovery is: --discoveryAddress, else ProxyConfig discoveryAddress, else
istiod.istio-system.svc:15012 in a Kubernetes pod (KUBERNETES_SERVICE_HOST set) and
localhost:15012 elsewhere, discovery's authenticated TLS port either way.

Environment (Istio's names; the downward API sets the pod's in a pod):
  POD_NAME, POD_NAMESPACE      the pod's name and namespace (node id, workload identity)
  INSTANCE_IP                  the pod IP (node id, inbound listeners, INSTANCE_IPS)
  SERVICE_ACCOUNT              the pod's service account (SPIFFE identity)
  PROXY_CONFIG                 ProxyConfig as YAML or JSON, over Istio's defaults; the pod's
                               proxy.istio.io/config annotation goes over it, flags over both
  ISTIO_META_*                 node metadata, the prefix removed (ISTIO_META_INTERCEPTION_MODE,
                               ISTIO_META_POD_PORTS, ISTIO_META_WORKLOAD_NAME, ...)
  ISTIO_DELTA_XDS              false for State of the World xDS (default true: Delta)
  ISTIO_BOOTSTRAP_OVERRIDE     a file merged over the generated bootstrap
  ISTIO_KUBE_APP_PROBERS       the app's probes, rewritten to /app-health/ on the status port
  ISTIO_PROMETHEUS_ANNOTATIONS the app's prometheus.io annotations, for the merged metrics
  EXIT_ON_ZERO_ACTIVE_CONNECTIONS, MINIMUM_DRAIN_DURATION
                               on SIGTERM, exit once connections reach zero after at least
                               the minimum drain (default: drain terminationDrainDuration)
  KUBERNETES_SERVICE_HOST      tells the agent it runs in a Kubernetes pod
  WASMESH_LOCALHOST, WASMESH_WILDCARD, WASMESH_BASE_ID
                               the local mesh's per-pod loopback addresses and hot-restart
                               base id (pods sharing one network namespace)

Files: --podInfoDir holds the downward-API labels and annotations; --certDir certificates
the proxy reads itself (cert-chain.pem, key.pem, root-cert.pem; Istio's FILE_MOUNTED_CERTS),
watched: a change hot-restarts the proxy.`
