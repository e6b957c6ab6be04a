package localmesh

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStopOrderStopsCallersBeforeTheirCallees(t *testing.T) {
	pod := func(app, ns string, calls ...string) *Pod {
		return &Pod{Spec: PodSpec{Name: app + "." + ns, Namespace: ns, Labels: map[string]string{"app": app}, Calls: calls}}
	}
	names := func(waves [][]*Pod) [][]string {
		var out [][]string
		for _, w := range waves {
			var names []string
			for _, p := range w {
				names = append(names, p.Spec.Name)
			}
			out = append(out, names)
		}
		return out
	}

	var bookinfo []*Pod
	for _, spec := range Bookinfo() {
		spec.Namespace, spec.Name = "default", spec.Labels["app"]+"-"+spec.Labels["version"]
		bookinfo = append(bookinfo, &Pod{Spec: spec})
	}
	assert.Equal(t, [][]string{{"productpage-v1"}, {"reviews-v1", "reviews-v2"}, {"ratings-v1"}, {"mongodb-v1"}}, names(stopOrder(bookinfo)),
		"the front end first (its startup call counts too), the database last (a tcp:// call counts too)")

	// A short host is in the caller's namespace; a call to another namespace's service of
	// the same name does not hold this one.
	a := pod("a", "x", "http://b:80/", "http://c.y.svc.cluster.local/")
	b, cx, cy := pod("b", "x"), pod("c", "x"), pod("c", "y")
	assert.Equal(t, [][]string{{"a.x", "c.x"}, {"b.x", "c.y"}}, names(stopOrder([]*Pod{a, b, cx, cy})))

	// A cycle stops together, after what calls into it.
	front := pod("front", "x", "http://p.x/")
	p, q := pod("p", "x", "http://q.x/"), pod("q", "x", "http://p.x/")
	assert.Equal(t, [][]string{{"front.x"}, {"p.x", "q.x"}}, names(stopOrder([]*Pod{p, q, front})))
}
