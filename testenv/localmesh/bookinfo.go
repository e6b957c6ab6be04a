package localmesh

import "time"

// Bookinfo is the sample application's pods (Istio's bookinfo, with the echo app in every
// role): productpage calls reviews, whose two versions call ratings, which keeps its
// ratings in a database over TCP (mongodb, echo's line protocol), as bookinfo's ratings-v2
// does. Every pod asks for an
// extra stat tag, request_method, which the telemetry filter's configuration in the sample
// config adds as a dimension (request_host, the other one it adds, is one of Istio's default
// tags); without the annotation Envoy would leave the tag in the metric's name. Each app runs
// as its own service account, as in Istio's bookinfo, so each has its own SPIFFE identity.
func Bookinfo() []PodSpec {
	svc := func(name string) string { return "http://" + name + ".default.svc.cluster.local:9080/" }
	extra := map[string]string{"sidecar.istio.io/extraStatTags": "request_method"}
	return []PodSpec{
		{Labels: map[string]string{"app": "mongodb", "version": "v1"}, ServiceAccount: "bookinfo-mongodb", Port: 27017, TCP: true},
		{Labels: map[string]string{"app": "ratings", "version": "v1"}, ServiceAccount: "bookinfo-ratings", Annotations: extra,
			Calls: []string{"tcp://mongodb.default.svc.cluster.local:27017"}},
		{Labels: map[string]string{"app": "reviews", "version": "v1"}, ServiceAccount: "bookinfo-reviews", Calls: []string{svc("ratings")}, Annotations: extra},
		{Labels: map[string]string{"app": "reviews", "version": "v2"}, ServiceAccount: "bookinfo-reviews", Calls: []string{svc("ratings")}, Annotations: extra},
		{Labels: map[string]string{"app": "productpage", "version": "v1"}, ServiceAccount: "bookinfo-productpage", Calls: []string{svc("reviews")},
			Annotations: map[string]string{
				"sidecar.istio.io/extraStatTags": "request_method",
				"prometheus.io/scrape":           "true",
				"prometheus.io/port":             "8080",
				"prometheus.io/path":             "/metrics",
			},
			HoldApplicationUntilProxyStarts: true,
			StartupCall:                     svc("reviews"),
			TerminationDrainDuration:        3 * time.Second,
		},
	}
}
