package partition

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shardmq/shardmq/internal/netbed"
)

// slowRelay forwards the TCP connections made to it on a host to a
// server, each chunk after a delay that can be changed at any time: a slow
// link where the kernel has no netem. It listens and dials on the host
// itself, so its connections to the server cross that host's own link (a
// cut of the link cuts them too).
type slowRelay struct {
	w      *world
	host   *netbed.Host
	ln     net.Listener
	target string
	delay  atomic.Int64 // ns, each way
}

// relay starts a relay on host to target ("host:port").
func (w *world) relay(host, target string) *slowRelay {
	w.t.Helper()
	h := w.hosts[host]
	ln, err := h.Listen(":0")
	if err != nil {
		w.t.Fatal(err)
	}
	r := &slowRelay{w: w, host: h, ln: ln, target: target}
	w.t.Cleanup(func() { ln.Close() })
	go r.serve()
	return r
}

func (r *slowRelay) addr() string { return r.ln.Addr().String() }

// setDelay delays every chunk read from now on by d, each way.
func (r *slowRelay) setDelay(d time.Duration) { r.delay.Store(int64(d)) }

func (r *slowRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(r.w.ctx, 10*time.Second)
			up, err := r.host.DialContext(ctx, "tcp", r.target)
			cancel()
			if err != nil {
				c.Close()
				return
			}
			go r.pipe(up, c)
			go r.pipe(c, up)
		}()
	}
}

// pipe copies src to dst, each chunk written once the delay in force
// when it was read has passed; chunks keep their order and reading goes
// on meanwhile (a delay, not a narrower pipe). Either side failing
// closes both.
func (r *slowRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		data []byte
		due  time.Time
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(r.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	defer src.Close()
	for c := range ch {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.data); err != nil {
			io.Copy(io.Discard, src)
			return
		}
	}
}

// throughRelay rewrites the world's topology file so that the routers
// started after it reach server addr through relay.
func (w *world) throughRelay(addr string, r *slowRelay) {
	w.t.Helper()
	data, err := os.ReadFile(w.topo)
	if err != nil {
		w.t.Fatal(err)
	}
	if !strings.Contains(string(data), "tcp("+addr+")") {
		w.fatalf("no server at %s in the topology", addr)
	}
	data = []byte(strings.ReplaceAll(string(data), "tcp("+addr+")", "tcp("+r.addr()+")"))
	if err := os.WriteFile(w.topo, data, 0o644); err != nil {
		w.t.Fatal(err)
	}
}
