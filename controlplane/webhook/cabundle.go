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

// PatcherOptions configure a CABundlePatcher.
type PatcherOptions struct {
	Client kubernetes.Interface
	// Name is the ValidatingWebhookConfiguration whose webhooks' caBundle is kept.
	Name  string
	Certs Certs
	Log   *slog.Logger
	// Registerer takes istiod's galley_validation_config_* counters (nil: not registered).
	Registerer prometheus.Registerer
}

// CABundlePatcher keeps the caBundle of every webhook of one ValidatingWebhookConfiguration
// equal to the CA the server's certificate chains to: at start, when the CA changes, and
// whenever someone changes the configuration (an informer watches it). The manifests
// create the configuration; the patcher changes nothing else in it. Only the leader runs one.
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
	p := &CABundlePatcher{opts: opts, log: opts.Log.With("scope", "webhook", "webhookConfig", opts.Name),
		updates: prometheus.NewCounter(prometheus.CounterOpts{Name: "galley_validation_config_updates", Help: "k8s webhook configuration updates"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "galley_validation_config_update_error", Help: "k8s webhook configuration update error"},
			[]string{"error"}),
	}
	if opts.Registerer != nil {
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
	inf := f.Admissionregistration().V1().ValidatingWebhookConfigurations()
	lister := inf.Lister()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Minute))
	enqueue := func(any) { q.Add(p.opts.Name) }
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
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
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return
	}
	q.Add(p.opts.Name) // the configuration may not exist yet: say so once
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		if err := p.reconcile(ctx, lister.Get); err != nil && ctx.Err() == nil {
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
func (p *CABundlePatcher) reconcile(ctx context.Context, get func(string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error)) error {
	ca := p.opts.Certs.CABundle()
	if len(ca) == 0 {
		return nil // no CA yet: its arrival queues this again
	}
	cur, err := get(p.opts.Name)
	if apierrors.IsNotFound(err) {
		p.log.Warn("ValidatingWebhookConfiguration not found; its caBundle is set once it is created")
		return nil
	}
	if err != nil {
		return err
	}
	stale := false
	for _, wh := range cur.Webhooks {
		stale = stale || !bytes.Equal(wh.ClientConfig.CABundle, ca)
	}
	if !stale {
		return nil
	}
	upd := cur.DeepCopy()
	for i := range upd.Webhooks {
		upd.Webhooks[i].ClientConfig.CABundle = ca
	}
	// An update conditioned on the version read: a conflict reads the newer one again.
	latest, err := p.opts.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("updating ValidatingWebhookConfiguration %s: %w", p.opts.Name, err)
	}
	p.updates.Inc()
	p.log.Info("webhook caBundle patched", "resourceVersion", latest.ResourceVersion, "webhooks", len(upd.Webhooks))
	return nil
}
