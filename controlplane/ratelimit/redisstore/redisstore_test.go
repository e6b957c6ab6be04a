package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/wasmesh/wasmesh/controlplane/ratelimit/redistest"
)

func TestParseAddrs(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:6379":             " [127.0.0.1:6379]",
		"a:1, b:2,":                  " [a:1 b:2]",
		"mymaster@s1:26379,s2:26379": "mymaster [s1:26379 s2:26379]",
		"@a:1":                       `error: redis address "@a:1": empty Sentinel master name before @`,
		"a:1,nohost":                 `error: redis address "nohost": want host:port`,
		"m@":                         `error: redis address "": no host:port`,
	} {
		m, addrs, err := ParseAddrs(in)
		got := fmt.Sprintf("%s %v", m, addrs)
		if err != nil {
			got = "error: " + err.Error()
		}
		if got != want {
			t.Errorf("ParseAddrs(%q) = %s, want %s", in, got, want)
		}
	}
	if _, err := New(Options{Addrs: "a@h:1", MasterName: "b"}); err == nil || !strings.Contains(err.Error(), `names master "a" but the master name is "b"`) {
		t.Errorf("conflicting master names: %v", err)
	}
}

func incrTwice(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Keys in different hash slots (on different nodes of a cluster), one call.
	incs := []Incr{{Key: "d_a_1_0", Hits: 1, Expire: time.Minute}, {Key: "d_b_2_0", Hits: 5, Expire: time.Hour}, {Key: "d_c_3_0", Hits: 2, Expire: time.Minute}}
	for _, want := range [][]uint64{{1, 5, 2}, {2, 10, 4}} {
		got, err := s.Incr(ctx, incs)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Incr = %v, want %v", got, want)
		}
	}
	if s.RoundTrips() != 2 {
		t.Fatalf("%d round trips for 2 calls", s.RoundTrips())
	}
}

func TestIncrSingle(t *testing.T) {
	r := redistest.Start(t)
	s, err := New(Options{Addrs: r.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	incrTwice(t, s)
	if ttl := r.Do("TTL", "d_b_2_0"); ttl != "3600" && ttl != "3599" {
		t.Fatalf("TTL of d_b_2_0 %s, want an hour", ttl)
	}
	if n := r.Calls("incrby"); n != 6 {
		t.Fatalf("%d INCRBY, want 6", n)
	}
}

// TestIncrSentinel finds the master through a real Sentinel, by master@sentinel and by flag.
func TestIncrSentinel(t *testing.T) {
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, master, "mymaster")
	for _, o := range []Options{{Addrs: "mymaster@" + sentinel.Addr}, {Addrs: sentinel.Addr, MasterName: "mymaster"}} {
		master.Do("FLUSHALL")
		s, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		incrTwice(t, s)
		s.Close()
		if got := master.Do("GET", "d_b_2_0"); got != "10" {
			t.Fatalf("%+v: the master holds %q, want 10", o, got)
		}
	}
}

// TestIncrCluster spreads one call's keys over a real 3-node Redis Cluster.
func TestIncrCluster(t *testing.T) {
	nodes := redistest.StartCluster(t, 3)
	s, err := New(Options{Addrs: nodes[0].Addr + "," + nodes[1].Addr + "," + nodes[2].Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	incrTwice(t, s)
	used := 0
	for _, n := range nodes {
		if n.Calls("incrby") > 0 {
			used++
		}
	}
	if used < 2 {
		t.Fatalf("the keys landed on %d node(s); the test wants them spread", used)
	}
	// One address with cluster mode set is a cluster too.
	one, err := New(Options{Addrs: nodes[1].Addr, Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := one.Incr(ctx, []Incr{{Key: "d_a_1_0", Hits: 1, Expire: time.Minute}, {Key: "d_c_3_0", Hits: 1, Expire: time.Minute}})
	if err != nil || !reflect.DeepEqual(got, []uint64{3, 5}) {
		t.Fatalf("cluster mode from one address: %v %v", got, err)
	}
}
