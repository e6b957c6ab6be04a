package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"

	"github.com/wasmesh/wasmesh/controlplane/ca"
	"github.com/wasmesh/wasmesh/controlplane/inject"
	"github.com/wasmesh/wasmesh/controlplane/leader"
	"github.com/wasmesh/wasmesh/controlplane/webhook"
)

// WebhookOptions configure the admission webhook server.
type WebhookOptions struct {
	// Addr serves the webhooks over TLS, e.g. ":15017"; empty: no webhook server.
	Addr string
	// CertDir holds tls.crt, tls.key and ca.crt (reloaded when they change); empty: a
	// certificate is generated, signed by a CA shared through a Secret (needs Kube).
	CertDir string
	// ServiceName is the webhook Service whose names a generated certificate holds; Hosts are
	// more names or addresses for it. CASecret names the CA Secret (default
	// webhook.DefaultCASecret), CertTTL the certificate's lifetime (renewed at two thirds).
	ServiceName string
	Hosts       []string
	CASecret    string
	CertTTL     time.Duration
	// ConfigName is the ValidatingWebhookConfiguration whose webhooks' caBundle discovery
	// keeps (the leader, with LeaderElection); empty: none.
	ConfigName string
	// Injection serves sidecar injection on /inject: InjectConfigDir holds the files config
	// and values of Istio's istio-sidecar-injector ConfigMap (empty: the defaults; reloaded
	// when they change, the last good kept), InjectorConfigName is the
	// MutatingWebhookConfiguration whose caBundle discovery keeps (empty: none), and
	// NativeSidecars is ENABLE_NATIVE_SIDECARS (auto: when the API server is 1.33 or later).
	Injection          bool
	InjectConfigDir    string
	InjectorConfigName string
	NativeSidecars     inject.NativeMode
}

// kubeClient is a clientset on Options.Kube, for the webhook's CA and configuration and the
// Lease.
func (d *Discovery) kubeClient() (kubernetes.Interface, error) {
	if d.opts.Kube == nil {
		return nil, nil
	}
	kc, err := kubernetes.NewForConfig(d.opts.Kube)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", d.opts.Kube.Host, err)
	}
	return kc, nil
}

// singletons sets up the webhook server and the work only one replica does: with leader
// election, the elected replica patches the webhook's caBundle and writes the status of
// Istio objects; without, this replica does (statuses as KubeStatus says).
func (d *Discovery) singletons() error {
	kc, err := d.kubeClient()
	if err != nil {
		return err
	}
	if err := d.certificateAuthority(kc); err != nil {
		return err
	}
	if err := d.webhook(kc); err != nil {
		return err
	}
	if d.CA != nil && kc != nil && d.opts.CA.SecureGRPCAddr != "" {
		d.rootCMs = &ca.RootPublisher{Client: kc, CA: d.CA, Log: d.log}
	}
	if !d.opts.LeaderElection || kc == nil {
		return nil
	}
	if d.Leader, err = leader.New(leader.Options{Client: kc, Namespace: d.opts.Namespace, Identity: d.opts.Identity,
		LeaseDuration: d.opts.LeaseDuration, Log: d.log, Registerer: d.Reg}); err != nil {
		return err
	}
	if d.Kube != nil {
		w := d.Kube.StatusWriter()
		d.Leader.Add("statusWriter", func(ctx context.Context) {
			w.SetEnabled(true)
			<-ctx.Done()
			w.SetEnabled(false)
		})
	}
	for _, p := range d.caBundles {
		d.Leader.Add("webhookCABundle", p.Run)
	}
	if d.rootCMs != nil {
		d.Leader.Add("caRootConfigMap", d.rootCMs.Run)
	}
	return nil
}

// webhook binds the webhook server with /validate, and sets up its certificates and the
// caBundle patcher.
func (d *Discovery) webhook(kc kubernetes.Interface) error {
	o := d.opts.Webhook
	if o.Addr == "" {
		return nil
	}
	log := d.log.With("scope", "webhook")
	switch {
	case o.CertDir != "":
		fc, err := webhook.NewFileCerts(o.CertDir, d.log)
		if err != nil {
			return err
		}
		d.webhookCerts = fc
	case kc != nil:
		gc, err := webhook.NewGeneratedCerts(webhook.GenerateOptions{CA: d.CA.Refresh, Namespace: d.opts.Namespace,
			ServiceName: o.ServiceName, Hosts: o.Hosts, TTL: o.CertTTL, Log: d.log})
		if err != nil {
			return err
		}
		d.webhookCerts = gc
	default:
		log.Warn("no webhook server: it needs certificates from webhookCertDir, or the Kubernetes API server to keep a CA in",
			"webhookAddr", o.Addr)
		return nil
	}
	for _, c := range []struct{ kind, name string }{{webhook.Validating, o.ConfigName}, {webhook.Mutating, o.InjectorConfigName}} {
		if c.name == "" || kc == nil || (c.kind == webhook.Mutating && !o.Injection) {
			continue
		}
		p, err := webhook.NewCABundlePatcher(webhook.PatcherOptions{Client: kc, Kind: c.kind, Name: c.name, Certs: d.webhookCerts, Log: d.log, Registerer: d.Reg})
		if err != nil {
			return err
		}
		d.caBundles = append(d.caBundles, p)
	}
	v, err := webhook.NewValidator(d.log, d.Reg)
	if err != nil {
		return err
	}
	if d.Webhook, err = webhook.New(webhook.Options{Addr: o.Addr, Certs: d.webhookCerts, Log: d.log, Registerer: d.Reg}); err != nil {
		return err
	}
	d.Webhook.HandleAdmission(webhook.ValidatePath, v.Admit)
	if o.Injection {
		return d.injection(kc)
	}
	return nil
}

// injection serves /inject with the injector's configuration and the mesh config in force.
func (d *Discovery) injection(kc kubernetes.Interface) error {
	o := d.opts.Webhook
	cfg, err := inject.LoadConfig(o.InjectConfigDir)
	if err != nil {
		return err
	}
	native, err := nativeSidecars(o.NativeSidecars, kc, d.log)
	if err != nil {
		return err
	}
	if d.Injector, err = inject.NewWebhook(inject.WebhookOptions{Config: cfg, Mesh: d.Mesh.Mesh, Native: native, Log: d.log, Registerer: d.Reg}); err != nil {
		return err
	}
	d.Webhook.HandleAdmission(inject.Path, d.Injector.Admit)
	return nil
}

// nativeSidecars resolves ENABLE_NATIVE_SIDECARS: true, false, or auto: native sidecars when
// the API server is Kubernetes 1.33 or later (sidecar containers are GA there; Istio's
// auto-stable), asked once it answers.
func nativeSidecars(mode inject.NativeMode, kc kubernetes.Interface, log *slog.Logger) (func() bool, error) {
	switch mode {
	case inject.NativeTrue:
		return func() bool { return true }, nil
	case inject.NativeFalse:
		return func() bool { return false }, nil
	case "", inject.NativeAuto:
	default:
		return nil, fmt.Errorf("ENABLE_NATIVE_SIDECARS %q: want true, false or auto", mode)
	}
	if kc == nil {
		return func() bool { return false }, nil
	}
	var mu sync.Mutex
	var known, native bool
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		if known {
			return native
		}
		v, err := kc.Discovery().ServerVersion()
		if err != nil {
			log.Warn("native sidecars: the API server's version is not known yet; not native for now", "error", err)
			return false
		}
		parsed, err := version.ParseGeneric(v.GitVersion)
		known, native = true, err == nil && parsed.AtLeast(version.MajorMinor(1, 33))
		log.Info("native sidecars decided by the API server's version", "version", v.GitVersion, "native", native)
		return native
	}, nil
}

// WebhookAddr is the bound webhook address ("" without a webhook server).
func (d *Discovery) WebhookAddr() string {
	if d.Webhook == nil {
		return ""
	}
	return d.Webhook.Addr()
}

// runSingletons starts the webhook server, its certificates and the singleton work, under
// goRun.
func (d *Discovery) runSingletons(ctx context.Context, goRun func(string, func() error), grace time.Duration) {
	if d.Webhook != nil {
		goRun("webhookCerts", func() error { return d.webhookCerts.Run(ctx) })
		goRun("webhook", func() error { return d.Webhook.Run(ctx, grace) })
	}
	if dir := d.opts.Webhook.InjectConfigDir; d.Injector != nil && dir != "" {
		goRun("injectConfig", func() error { return d.Injector.WatchConfig(ctx, dir) })
	}
	switch {
	case d.Leader != nil:
		goRun("leaderElection", func() error { return d.Leader.Run(ctx) })
	default:
		for _, p := range d.caBundles {
			goRun("webhookCABundle", func() error { p.Run(ctx); return nil })
		}
		if d.rootCMs != nil {
			goRun("caRootConfigMap", func() error { d.rootCMs.Run(ctx); return nil })
		}
	}
}

// leaderHandler serves /debug/leader: the Lease and who holds it, or, without leader
// election, that this replica does the singleton work itself.
func (d *Discovery) leaderHandler() http.Handler {
	if d.Leader != nil {
		return d.Leader.Handler()
	}
	id := d.opts.Identity
	if id == "" {
		id = leader.Identity()
	}
	st := leader.Status{Identity: id, Leading: true, Leader: id, Tasks: []string{}}
	for range d.caBundles {
		st.Tasks = append(st.Tasks, "webhookCABundle")
	}
	if d.rootCMs != nil {
		st.Tasks = append(st.Tasks, "caRootConfigMap")
	}
	if d.Kube != nil && d.opts.KubeStatus {
		st.Tasks = append(st.Tasks, "statusWriter")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
}
