package router

import (
	"net/http"

	"github.com/wasmesh/wasmesh/testenv/proxy/route"
)

// requestHash computes the route's hash_policy hash for ring hash and maglev balancers.
// Not implemented yet: no route yields a hash.
func requestHash(_ *route.Route, _ *http.Request) (uint64, bool) { return 0, false }
