package ca

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// RootPublisher keeps the ConfigMap istio-ca-root-cert (key root-cert.pem) in every
// namespace holding the CA's roots, as istiod's namespace controller does: created in a new
// namespace, written back when edited or deleted, rewritten everywhere when the roots
// change. Only the leader runs it.
type RootPublisher struct {
	Client kubernetes.Interface
	CA     *Keeper
	Log    *slog.Logger
}

// Run keeps the ConfigMaps current until ctx ends.
func (p *RootPublisher) Run(ctx context.Context) {
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("scope", "ca", "configMap", RootConfigMap)
	nsf := informers.NewSharedInformerFactory(p.Client, 0)
	cmf := informers.NewSharedInformerFactoryWithOptions(p.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", RootConfigMap).String()
	}))
	nsInf, cmInf := nsf.Core().V1().Namespaces().Informer(), cmf.Core().V1().ConfigMaps().Informer()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Minute))
	byNamespace := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			q.Add(o.Name)
		case *corev1.ConfigMap:
			q.Add(o.Namespace)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: byNamespace, UpdateFunc: func(_, o any) { byNamespace(o) }, DeleteFunc: byNamespace}
	_, _ = nsInf.AddEventHandler(handler)
	_, _ = cmInf.AddEventHandler(handler)
	nsf.Start(ctx.Done())
	cmf.Start(ctx.Done())
	defer nsf.Shutdown()
	defer cmf.Shutdown()
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	go func() { // new roots: every namespace again
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.CA.Changed():
				for _, ns := range nsInf.GetStore().ListKeys() {
					q.Add(ns)
				}
			}
		}
	}()
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.HasSynced, cmInf.HasSynced) {
		return
	}
	for {
		ns, shutdown := q.Get()
		if shutdown {
			return
		}
		if err := p.reconcile(ctx, ns, nsInf.GetStore(), cmInf.GetStore()); err != nil && ctx.Err() == nil {
			log.Warn("writing the root ConfigMap failed; retrying", "namespace", ns, "error", err)
			q.AddRateLimited(ns)
		} else {
			q.Forget(ns)
		}
		q.Done(ns)
	}
}

// reconcile makes namespace ns's ConfigMap hold the roots.
func (p *RootPublisher) reconcile(ctx context.Context, ns string, namespaces, configMaps cache.Store) error {
	a := p.CA.Current()
	if a == nil {
		return nil // no CA yet: its arrival queues every namespace
	}
	obj, ok, err := namespaces.GetByKey(ns)
	if err != nil || !ok || obj.(*corev1.Namespace).Status.Phase == corev1.NamespaceTerminating {
		return err
	}
	cms := p.Client.CoreV1().ConfigMaps(ns)
	obj, ok, err = configMaps.GetByKey(ns + "/" + RootConfigMap)
	if err != nil {
		return err
	}
	if !ok {
		_, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootConfigMap, Namespace: ns, Labels: map[string]string{"istio.io/config": "true"}},
			Data:       map[string]string{RootCertFile: string(a.RootPEM)},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) { // already there: its event queues it again
			return fmt.Errorf("creating %s/%s: %w", ns, RootConfigMap, err)
		}
		return nil
	}
	cm := obj.(*corev1.ConfigMap)
	if bytes.Equal([]byte(cm.Data[RootCertFile]), a.RootPEM) {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[RootCertFile] = string(a.RootPEM)
	// Conditioned on the version read: a conflict reads the newer one again.
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating %s/%s: %w", ns, RootConfigMap, err)
	}
	return nil
}
