package bench

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoPeerEnv names the address an echo peer (this test binary, re-run) dials.
const echoPeerEnv = "WASMESH_BENCH_ECHO_PEER"

// wakeMessage is the size of a small push or its ACK.
const wakeMessage = 300

func TestMain(m *testing.M) {
	if addr := os.Getenv(echoPeerEnv); addr != "" {
		os.Exit(echoPeer(addr))
	}
	os.Exit(m.Run())
}

// echoPeer answers each message after a pause (WASMESH_BENCH_ECHO_GAP), so the other side
// waits idle for it, as a control plane waits for a proxy's ACK.
func echoPeer(addr string) int {
	gap, err := time.ParseDuration(os.Getenv("WASMESH_BENCH_ECHO_GAP"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo peer:", err)
		return 2
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo peer:", err)
		return 2
	}
	buf := make([]byte, wakeMessage)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0
		}
		if gap > 0 {
			time.Sleep(gap)
		}
		if _, err := c.Write(buf); err != nil {
			return 0
		}
	}
}

// BenchmarkMessageToIdleProcess is the machine's price of a message that finds its process
// idle: this process sends a message and waits for the answer of another process, which
// answers at once ("gap=0") or after a pause ("gap=2ms", in which this process goes idle and
// its runtime parks its threads). The difference is what each ACK of a small push costs a
// quiet control plane before it does any work of its own; a push to thousands of proxies
// keeps the server busy and pays it rarely. "procs=1" shows how much of it the runtime's
// search for work on its other, idle Ps adds.
func BenchmarkMessageToIdleProcess(b *testing.B) {
	exe, err := os.Executable()
	require.NoError(b, err)
	for _, gap := range []time.Duration{0, 2 * time.Millisecond} {
		for _, procs := range []int{runtime.GOMAXPROCS(0), 1} {
			b.Run(fmt.Sprintf("gap=%v/procs=%d", gap, procs), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				require.NoError(b, err)
				defer ln.Close()
				peer := exec.Command(exe, "-test.run=^$")
				peer.Env = append(os.Environ(), echoPeerEnv+"="+ln.Addr().String(), "WASMESH_BENCH_ECHO_GAP="+gap.String())
				peer.Stderr = os.Stderr
				require.NoError(b, peer.Start())
				defer peer.Wait() //nolint:errcheck // it ends when the connection closes
				c, err := ln.Accept()
				require.NoError(b, err)
				defer c.Close()
				buf := make([]byte, wakeMessage)
				roundTrip := func() {
					_, err := c.Write(buf)
					require.NoError(b, err)
					_, err = io.ReadFull(c, buf)
					require.NoError(b, err)
				}
				roundTrip() // the peer is up
				before := processCPU()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					roundTrip()
				}
				b.StopTimer()
				b.ReportMetric((processCPU()-before).Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}
