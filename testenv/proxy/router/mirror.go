package router

import (
	"net/http"

	"github.com/wasmesh/wasmesh/testenv/proxy/hcm"
	"github.com/wasmesh/wasmesh/testenv/proxy/route"
)

// mirror sends shadow copies of req to the route's request_mirror_policies clusters
// (fire and forget). Not implemented yet: mirror policies are ignored.
func mirror(_ *hcm.Context, _ *hcm.Stream, _ *route.Route, _ *http.Request) {}
