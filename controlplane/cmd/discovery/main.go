// Command discovery is wasmesh's xDS control plane (pilot-discovery): it reads Istio config
// from a watched directory and serves it to proxies over ADS.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/wasmesh/wasmesh/controlplane/discovery"
	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/controlplane/logging"
	"github.com/wasmesh/wasmesh/controlplane/push"
	"github.com/wasmesh/wasmesh/controlplane/registry"
	"github.com/wasmesh/wasmesh/controlplane/server"
	"github.com/wasmesh/wasmesh/controlplane/source/kube"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

func main() {
	if err := newCommand().ExecuteContext(context.Background()); err != nil {
		os.Exit(1)
	}
}

// env reads istiod's environment settings over the defaults.
func env(opts *discovery.Options) error {
	dur := func(name string, dst *time.Duration) error {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("%s=%q: want a duration such as 100ms", name, v)
			}
			*dst = d
		}
		return nil
	}
	s := &opts.Server
	if err := dur("PILOT_DEBOUNCE_AFTER", &opts.Debounce.After); err != nil {
		return err
	}
	if err := dur("PILOT_DEBOUNCE_MAX", &opts.Debounce.Max); err != nil {
		return err
	}
	if err := dur("PILOT_XDS_SEND_TIMEOUT", &s.SendTimeout); err != nil {
		return err
	}
	if err := dur("PILOT_WORKLOAD_ENTRY_GRACE_PERIOD", &opts.WorkloadGracePeriod); err != nil {
		return err
	}
	if v := os.Getenv("PILOT_ENABLE_EDS_DEBOUNCE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("PILOT_ENABLE_EDS_DEBOUNCE=%q: want true or false", v)
		}
		opts.Debounce.EnableEDS = b
	}
	if v := os.Getenv("PILOT_PUSH_THROTTLE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("PILOT_PUSH_THROTTLE=%q: want a positive integer", v)
		}
		s.PushThrottle = n
	}
	if v := os.Getenv("ENABLE_NATIVE_SIDECARS"); v != "" {
		m, err := inject.ParseNativeMode(v)
		if err != nil {
			return fmt.Errorf("ENABLE_NATIVE_SIDECARS=%w", err)
		}
		opts.Webhook.NativeSidecars = m
	}
	if err := dur("DEFAULT_WORKLOAD_CERT_TTL", &opts.CA.WorkloadCertTTL); err != nil {
		return err
	}
	if err := dur("MAX_WORKLOAD_CERT_TTL", &opts.CA.MaxWorkloadCertTTL); err != nil {
		return err
	}
	if v := os.Getenv("PILOT_MAX_REQUESTS_PER_SECOND"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 {
			return fmt.Errorf("PILOT_MAX_REQUESTS_PER_SECOND=%q: want a non-negative number", v)
		}
		s.ConnectRate = f
	}
	return nil
}

// chooseRegistries sets what discovery serves from, Istio's --registries: Kubernetes (the API
// server of --kubeconfig, or the pod's own) and File (--configDir). Without the flag, each
// one it has the means for.
func chooseRegistries(opts *discovery.Options, registries []string, kubeconfig string) error {
	useKube := kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	useFile := opts.ConfigDir != ""
	if len(registries) > 0 {
		useKube, useFile = false, false
		for _, r := range registries {
			switch strings.ToLower(strings.TrimSpace(r)) {
			case "kubernetes":
				useKube = true
			case "file":
				useFile = true
			default:
				return fmt.Errorf("--registries: unknown registry %q (want Kubernetes or File)", r)
			}
		}
	}
	if useFile && opts.ConfigDir == "" {
		return errors.New("--registries File needs --configDir")
	}
	if !useFile {
		opts.ConfigDir = ""
	}
	if useKube {
		cfg, err := kube.RESTConfig(kubeconfig)
		if err != nil {
			return fmt.Errorf("--registries Kubernetes: %w", err)
		}
		// Replicas elect the one that writes the status of Istio objects (and patches the
		// webhook's caBundle); with --leaderElect=false, this one does.
		opts.Kube, opts.KubeStatus = cfg, true
	}
	return nil
}

// podNamespace is discovery's namespace when --namespace is not given: POD_NAMESPACE, else
// istiod's default.
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return "istio-system"
}

// chooseWebhook leaves the webhook server on its default address only where it can have
// certificates: from --webhookCertDir, or generated with the API server's help; likewise the
// secure port, where the CA can keep its root.
func chooseWebhook(cmd *cobra.Command, opts *discovery.Options) {
	if opts.Kube == nil && opts.Webhook.CertDir == "" && !cmd.Flags().Changed("webhookAddr") {
		opts.Webhook.Addr = ""
	}
	if opts.Kube == nil {
		opts.LeaderElection = false
	}
	if cmd.Flags().Changed("secureGRPCAddr") {
		return
	}
	// The CA needs a place for its root: the API server, --caDir or --caCertsDir.
	if opts.Kube == nil && opts.CA.Dir == "" && opts.CA.CertsDir == "" {
		opts.CA.SecureGRPCAddr = ""
	}
}

func newCommand() *cobra.Command {
	opts := discovery.Options{Debounce: push.DefaultDebounce(), Server: server.Defaults(), WorkloadGracePeriod: registry.DefaultGracePeriod, ShutdownGrace: 5 * time.Second,
		Identity: leader.Identity()}
	var logLevel, kubeconfig string
	var registries []string
	cmd := &cobra.Command{
		Use:   "discovery",
		Short: "wasmesh xDS control plane: Istio config from a directory, served over ADS",
		Long: `discovery reads Istio configuration (ServiceEntry, WorkloadEntry, and the other
Istio kinds) from --configDir, watches it, and serves CDS, EDS, LDS, RDS and ECDS to
proxies over ADS (State of the World and Delta) over TLS on --secureGRPCAddr, each stream
authenticated as the CA authenticates (a workload certificate, a service-account token or a
local-mesh credential) and its node allowed only its caller's namespace, service account and
addresses; plaintext only on a loopback --grpcAddr when asked for. Proxies that connect with
workload metadata are registered as endpoints of the ServiceEntries that select them.

On Kubernetes (--kubeconfig, or in a pod) it also serves the Istio objects of the API
server, validates them at apply time (the admission webhook on --webhookAddr, /validate),
injects the sidecar into pods (/inject, on the same server), signs workload certificates
(Istio's certificate API on --secureGRPCAddr; the CA's root kept in the Secret
istio-ca-secret, or --caDir without Kubernetes), and runs as several
replicas: one, elected on a Lease in --namespace, writes the objects' status and keeps the
caBundle of --validationWebhookConfigName and --injectorWebhookConfigName current.

Environment (istiod's names): PILOT_DEBOUNCE_AFTER (100ms), PILOT_DEBOUNCE_MAX (10s),
PILOT_ENABLE_EDS_DEBOUNCE (true), PILOT_PUSH_THROTTLE (100), PILOT_XDS_SEND_TIMEOUT (5s),
PILOT_MAX_REQUESTS_PER_SECOND (unset: no rate cap; new connections are admitted
by capacity, as many at once awaiting their initial config as PILOT_PUSH_THROTTLE, the rest
waiting in order up to 30s), PILOT_WORKLOAD_ENTRY_GRACE_PERIOD (10s),
ENABLE_NATIVE_SIDECARS (auto: when the API server is 1.33 or later; true, false),
DEFAULT_WORKLOAD_CERT_TTL (24h), MAX_WORKLOAD_CERT_TTL (2160h);
POD_NAMESPACE (--namespace's default), POD_NAME (this replica's name in the Lease; else
the hostname).`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: false,
		RunE: func(cmd *cobra.Command, _ []string) error {
			levels, err := logging.ParseLevels(logLevel)
			if err != nil {
				return err
			}
			// Flags win over the environment.
			flagGrace := opts.WorkloadGracePeriod
			if err := env(&opts); err != nil {
				return err
			}
			if cmd.Flags().Changed("workloadEntryGracePeriod") {
				opts.WorkloadGracePeriod = flagGrace
			}
			if err := chooseRegistries(&opts, registries, kubeconfig); err != nil {
				return err
			}
			chooseWebhook(cmd, &opts)
			opts.LogLevels = levels
			log := logging.New(cmd.ErrOrStderr(), levels)
			// client-go logs through klog: into the same log, under its own scope.
			klog.SetSlogLogger(log.With("scope", "kube"))
			d, err := discovery.New(opts, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return d.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.ConfigDir, "configDir", "", "directory of Istio YAML configuration, watched for changes")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the Kubernetes API server to serve from (in a pod: its service account)")
	f.StringSliceVar(&registries, "registries", nil, "what to serve from: Kubernetes, File (--configDir), or both "+
		"(default: Kubernetes with --kubeconfig or in a pod, File with --configDir)")
	f.StringVar(&opts.MeshConfigFile, "meshConfig", "", "MeshConfig YAML file (Istio's defaults when empty), watched for changes")
	f.StringVar(&opts.GRPCAddr, "grpcAddr", "", "address of the plaintext, unauthenticated xDS gRPC server: only an explicit loopback address "+
		"(e.g. 127.0.0.1:15010); empty: none (proxies use --secureGRPCAddr)")
	f.StringVar(&opts.HTTPAddr, "httpAddr", ":15014", "address of the debug and metrics HTTP server")
	f.StringVar(&logLevel, "log_output_level", "default:info", "per-scope levels, e.g. default:info,ads:debug (scopes: ads, filedir, mesh, serviceentry, autoregistration)")
	f.DurationVar(&opts.WorkloadGracePeriod, "workloadEntryGracePeriod", registry.DefaultGracePeriod, "how long a disconnected auto-registered proxy stays an endpoint (env PILOT_WORKLOAD_ENTRY_GRACE_PERIOD)")
	f.DurationVar(&opts.ShutdownGrace, "shutdownGrace", 5*time.Second, "how long open streams get to finish on shutdown")
	f.StringVar(&opts.WasmCacheDir, "wasmCacheDir", "", "where WasmPlugin modules fetched over http(s) are kept by sha256 (default: <user cache dir>/wasmesh/wasm)")
	addKubeFlags(f, &opts)
	addCAFlags(f, &opts.CA)
	f.BoolVar(&opts.MTLS, "mtls", true, "generate mutual TLS between workloads, as istiod: PeerAuthentication (PERMISSIVE unless configured), DestinationRule ISTIO_MUTUAL and auto mTLS "+
		"(every sidecar gets its certificate from the CA by SDS); --mtls=false for proxies without workload certificates")
	f.DurationVar(&opts.Server.ReconnectWindow, "reconnectWindow", opts.Server.ReconnectWindow,
		"after start, proxies resuming with their last config get no updates for this long, while the others reconnect and register")
	return cmd
}

// addKubeFlags adds the flags of discovery's namespace, leader election and webhook server.
func addKubeFlags(f *pflag.FlagSet, opts *discovery.Options) {
	f.StringVarP(&opts.Namespace, "namespace", "n", podNamespace(), "discovery's namespace, holding its Lease, webhook CA Secret and Service ($POD_NAMESPACE when set)")
	f.BoolVar(&opts.LeaderElection, "leaderElect", true, "on Kubernetes, elect one replica on a Lease to write the status of Istio objects and patch the webhook caBundle "+
		"(false: this replica does both)")
	f.DurationVar(&opts.LeaseDuration, "leaseDuration", leader.DefaultLeaseDuration, "how long the leader's Lease holds unrenewed: a leader that dies is replaced within about that long")
	w := &opts.Webhook
	f.StringVar(&w.Addr, "webhookAddr", webhook.DefaultAddr, "address of the admission webhook server (TLS; /validate); empty: none")
	f.StringVar(&w.CertDir, "webhookCertDir", "", "directory with the webhook's tls.crt, tls.key and ca.crt, reloaded on change "+
		"(default: a certificate signed by a CA kept in a Secret of discovery's namespace, shared by every replica)")
	f.StringVar(&w.ServiceName, "webhookServiceName", webhook.DefaultServiceName, "the webhook Service, whose DNS names the generated certificate holds")
	f.StringSliceVar(&w.Hosts, "webhookCertHosts", nil, "more DNS names or IP addresses for the generated certificate (a webhook configuration calling discovery by URL)")
	f.StringVar(&w.ConfigName, "validationWebhookConfigName", webhook.DefaultValidatingConfig,
		"the ValidatingWebhookConfiguration whose webhooks' caBundle discovery keeps current (the manifests create it); empty: none")
	f.BoolVar(&w.Injection, "injection", true, "serve sidecar injection on the webhook server (/inject)")
	f.StringVar(&w.InjectConfigDir, "injectConfigDir", "", "directory of the istio-sidecar-injector ConfigMap's files config and values, reloaded on change "+
		"(istiod mounts it at /var/lib/istio/inject; default: the built-in defaults)")
	f.StringVar(&w.InjectorConfigName, "injectorWebhookConfigName", webhook.DefaultMutatingConfig,
		"the MutatingWebhookConfiguration of injection whose caBundle discovery keeps current (the manifests create it); empty: none")
}

// addCAFlags adds the flags of the CA and its secure port.
func addCAFlags(f *pflag.FlagSet, o *discovery.CAOptions) {
	f.StringVar(&o.SecureGRPCAddr, "secureGRPCAddr", ":15012", "address of the TLS gRPC server of xDS (ADS, callers authenticated) and Istio's certificate API "+
		"(istio.v1.auth.IstioCertificateService); empty: none (default: without Kubernetes, --caDir or --caCertsDir, none unless given)")
	f.StringVar(&o.Dir, "caDir", "", "without Kubernetes: the directory the CA's self-signed root is made in once and kept "+
		"(ca-cert.pem, ca-key.pem; root-cert.pem there is the root workloads trust)")
	f.StringVar(&o.CertsDir, "caCertsDir", "", "a plugged-in CA, Istio's cacerts files (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); "+
		"on Kubernetes the Secret cacerts of discovery's namespace is read too; either wins over the self-signed root")
	f.StringVar(&o.LocalCredentialKey, "localCredentialKey", "", "PEM Ed25519 public key that local-mesh credentials are checked with "+
		"(the local mesh runner holds the private key; docs/contracts.md); empty: none accepted")
	f.StringSliceVar(&o.Hosts, "secureGRPCCertHosts", nil, "more DNS names or IP addresses for the secure port's certificate, beside the istiod Service's names")
}
