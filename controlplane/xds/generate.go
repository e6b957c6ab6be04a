package xds

// Wildcard reports whether a type is subscribed as a whole (CDS, LDS) rather than by name.
func Wildcard(typeURL string) bool { return typeURL == ClusterType || typeURL == ListenerType }

// Generate returns the resources of typeURL for the proxy: the full set for CDS and LDS,
// the named resources for EDS, RDS and ECDS.
func Generate(v *View, typeURL string, names []string) *Resources {
	if v.IsGRPC() {
		return generateGRPC(v, typeURL, names)
	}
	switch typeURL {
	case ClusterType:
		return Clusters(v)
	case ListenerType:
		return Listeners(v)
	case EndpointType:
		return NewResources(Endpoints(v, names))
	case RouteType:
		return NewResources(patchRoutes(v, Routes(v, names)))
	case ExtensionType:
		return NewResources(ExtensionConfigs(v, names))
	}
	return NewResources(nil)
}

// Dump generates every type with the names a proxy would subscribe to (the EDS clusters of
// its CDS, the route configurations and extension configs of its LDS), for config_dump and
// golden tests.
func Dump(v *View) map[string]*Resources {
	if v.IsGRPC() {
		return grpcDump(v)
	}
	out := map[string]*Resources{}
	cds := Clusters(v)
	out[ClusterType] = cds
	var eds []string
	for _, c := range cds.Items {
		if EndpointResource(v, c.Name) != nil {
			eds = append(eds, c.Name)
		}
	}
	out[EndpointType] = Generate(v, EndpointType, eds)
	out[ListenerType] = Listeners(v)
	out[RouteType] = Generate(v, RouteType, RouteNames(v))
	out[ExtensionType] = Generate(v, ExtensionType, ExtensionNames(v))
	return out
}
