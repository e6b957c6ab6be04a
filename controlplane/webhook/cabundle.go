package webhook

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// DefaultValidatingConfig is the ValidatingWebhookConfiguration discovery owns unless told
// otherwise: istiod's name for it in istio-system (istio-validator-<namespace>).
const DefaultValidatingConfig = "istio-validator-istio-system"

// DefaultMutatingConfig is the MutatingWebhookConfiguration of sidecar injection: istiod's
// name for it.
const DefaultMutatingConfig = "istio-sidecar-injector"

// A webhook configuration's kind.
const (
	Validating = "ValidatingWebhookConfiguration"
	Mutating   = "MutatingWebhookConfiguration"
)

// PatcherOptions configure a CABundlePatcher.
type PatcherOptions struct {
	Client kubernetes.Interface
	// Kind is Validating (the default) or Mutating; Name the webhook configuration whose
	// webhooks' caBundle is kept.
	Kind  string
	Name  string
	Certs Certs
	Log   *slog.Logger
	// Registerer takes istiod's galley_validation_config_* counters, for the validating
	// configuration only (nil: not registered).
	Registerer prometheus.Registerer
}

// CABundlePatcher keeps the caBundle of every webhook of one webhook configuration equal to
// the CA the server's certificate chains to: at start, when the CA changes, and whenever
// someone changes the configuration (an informer watches it). The manifests create the
// configuration; the patcher changes nothing else in it. Only the leader runs one.
type CABundlePatcher struct {
	opts    PatcherOptions
	log     *slog.Logger
	updates prometheus.Counter
	errors  *prometheus.CounterVec
}

// NewCABundlePatcher returns a patcher; Run runs it.
func NewCABundlePatcher(opts PatcherOptions) (*CABundlePatcher, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	switch opts.Kind {
	case "":
		opts.Kind = Validating
	case Validating, Mutating:
	default:
		return nil, fmt.Errorf("webhook patcher: kind %q: want %s or %s", opts.Kind, Validating, Mutating)
	}
	p := &CABundlePatcher{opts: opts, log: opts.Log.With("scope", "webhook", "webhookConfig", opts.Kind+"/"+opts.Name),
		updates: prometheus.NewCounter(prometheus.CounterOpts{Name: "galley_validation_config_updates", Help: "k8s webhook configuration updates"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galley_validation_config_update_error", Help: "k8s webhook configuration update error"},
			[]string{"error"}),
	}
	if opts.Registerer != nil && opts.Kind == Validating {
		for _, c := range []prometheus.Collector{p.updates, p.errors} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("webhook patcher metrics: %w", err)
			}
		}
	}
	return p, nil
}

// Run keeps the caBundle current until ctx ends.
func (p *CABundlePatcher) Run(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(p.opts.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.opts.Name).String()
	}))
	var inf cache.SharedIndexInformer
	if p.opts.Kind == Mutating {
		inf = f.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
	} else {
		inf = f.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer()
	}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Minute))
	enqueue := func(any) { q.Add(p.opts.Name) }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) },
	})
	f.Start(ctx.Done())
	defer f.Shutdown()
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	go func() { // a new CA
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.opts.Certs.Changed():
				q.Add(p.opts.Name)
			}
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	q.Add(p.opts.Name) // the configuration may not exist yet: say so once
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		if err := p.reconcile(ctx, inf.GetStore()); err != nil && ctx.Err() == nil {
			p.errors.WithLabelValues(string(apierrors.ReasonForError(err))).Inc()
			p.log.Warn("patching the webhook caBundle failed; retrying", "error", err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}

// reconcile sets the caBundle of each webhook of the configuration where it differs.
func (p *CABundlePatcher) reconcile(ctx context.Context, store cache.Store) error {
	ca := p.opts.Certs.CABundle()
	if len(ca) == 0 {
		return nil // no CA yet: its arrival queues this again
	}
	obj, ok, err := store.GetByKey(p.opts.Name)
	if err != nil {
		return err
	}
	if !ok {
		p.log.Warn(p.opts.Kind + " not found; its caBundle is set once it is created")
		return nil
	}
	upd, configs := copyConfigs(obj)
	stale := false
	for _, c := range configs {
		stale = stale || !bytes.Equal(c.CABundle, ca)
		c.CABundle = ca
	}
	if !stale {
		return nil
	}
	// An update conditioned on the version read: a conflict reads the newer one again.
	version, err := p.update(ctx, upd)
	if err != nil {
		return fmt.Errorf("updating %s %s: %w", p.opts.Kind, p.opts.Name, err)
	}
	p.updates.Inc()
	p.log.Info("webhook caBundle patched", "resourceVersion", version, "webhooks", len(configs))
	return nil
}

// copyConfigs is a copy of a webhook configuration and its webhooks' client configs.
func copyConfigs(obj any) (any, []*admissionregistrationv1.WebhookClientConfig) {
	var out []*admissionregistrationv1.WebhookClientConfig
	switch c := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		c = c.DeepCopy()
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
		return c, out
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		c = c.DeepCopy()
		for i := range c.Webhooks {
			out = append(out, &c.Webhooks[i].ClientConfig)
		}
		return c, out
	}
	return obj, nil
}

// update writes a webhook configuration back; it returns the new resourceVersion.
func (p *CABundlePatcher) update(ctx context.Context, obj any) (string, error) {
	api := p.opts.Client.AdmissionregistrationV1()
	switch c := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		latest, err := api.ValidatingWebhookConfigurations().Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			return "", err
		}
		return latest.ResourceVersion, nil
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		latest, err := api.MutatingWebhookConfigurations().Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			return "", err
		}
		return latest.ResourceVersion, nil
	}
	return "", fmt.Errorf("not a webhook configuration: %T", obj)
}
