// Package netbed puts the processes of a partition test on test hosts of
// their own — Linux network namespaces joined by veth pairs — so that a
// test can cut, slow and heal the network between two of them while the
// others keep talking.
//
// Every host has one address (10.98.0.N/32 on its loopback device) that
// all its peers reach it by; every link is a veth pair between two hosts
// with a /32 route each way, so traffic between two hosts always crosses
// their own link and nothing else. A cut takes one end of the link down:
// the other end keeps sending into it and nothing arrives (a blackhole, as
// a real partition looks: connects and writes time out, nobody is told).
// Heal brings it back and restores the routes. Delay adds latency with
// `tc netem` where the kernel has it (Delay answers ErrNoNetem where it
// does not).
//
// The namespaces are named "nb<pid>-<host>" and removed by Close (which a
// test registers with t.Cleanup, so they go even when the test fails);
// New also removes those of processes that died without closing. Removing
// a namespace removes its veths. Only root may do this; Available says
// whether this machine lets the caller, and why not.
package netbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoNetem: the kernel has no netem queueing discipline (Delay cannot
// slow a link).
var ErrNoNetem = errors.New("netbed: the kernel has no netem qdisc (sch_netem)")

// Available reports whether network namespaces can be made here: nil, or
// an error that says what is missing (not root, no `ip`, namespaces
// refused).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netbed: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netbed: iproute2's ip is not installed: %w", err)
	}
	name := fmt.Sprintf("nb%d-probe", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("netbed: cannot create a network namespace: %v: %s", err, bytes.TrimSpace(out))
	}
	exec.Command("ip", "netns", "del", name).Run()
	return nil
}

// cmdTimeout bounds every ip or tc command.
const cmdTimeout = 10 * time.Second

// Bed is a set of test hosts and the links between them.
type Bed struct {
	prefix string

	mu     sync.Mutex
	hosts  map[string]*Host
	links  map[string]*Link
	closed bool
}

// Host is one test host: a network namespace with one address.
type Host struct {
	Name string
	// NS is the namespace's name (for `ip netns exec`).
	NS string
	// Addr is the address every peer reaches the host by.
	Addr string
	n    int
}

// Link is the veth pair between two hosts.
type Link struct {
	A, B  *Host
	devA  string // in A's namespace
	devB  string // in B's namespace
	mu    sync.Mutex
	cut   bool
	netem bool
}

// New makes an empty bed; Close removes everything it made.
func New() (*Bed, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	sweep()
	return &Bed{prefix: fmt.Sprintf("nb%d-", os.Getpid()), hosts: map[string]*Host{}, links: map[string]*Link{}}, nil
}

// sweep removes the namespaces of netbed processes that are gone.
func sweep() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "nb") {
			continue
		}
		pidText, _, ok := strings.Cut(strings.TrimPrefix(name, "nb"), "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == nil {
			continue // its process still runs
		}
		exec.Command("ip", "netns", "del", name).Run()
	}
}

func run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netbed: %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Host adds a host named name (short: it is part of device names).
func (b *Bed) Host(name string) (*Host, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, errors.New("netbed: bed is closed")
	}
	if h, ok := b.hosts[name]; ok {
		return h, nil
	}
	n := len(b.hosts) + 1
	h := &Host{Name: name, NS: b.prefix + name, Addr: fmt.Sprintf("10.98.0.%d", n), n: n}
	if err := run("ip", "netns", "add", h.NS); err != nil {
		return nil, err
	}
	b.hosts[name] = h
	if err := run("ip", "-n", h.NS, "link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	if err := run("ip", "-n", h.NS, "addr", "add", h.Addr+"/32", "dev", "lo"); err != nil {
		return nil, err
	}
	return h, nil
}

// Connect joins two hosts with a link of their own.
func (b *Bed) Connect(a, c *Host) (*Link, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := linkKey(a, c)
	if l, ok := b.links[key]; ok {
		return l, nil
	}
	l := &Link{A: a, B: c, devA: fmt.Sprintf("v%d-%d", a.n, c.n), devB: fmt.Sprintf("v%d-%d", c.n, a.n)}
	if err := run("ip", "link", "add", l.devA, "netns", a.NS, "type", "veth", "peer", "name", l.devB, "netns", c.NS); err != nil {
		return nil, err
	}
	b.links[key] = l
	if err := l.up(); err != nil {
		return nil, err
	}
	return l, nil
}

// Link returns the link between two hosts, nil if none.
func (b *Bed) Link(a, c *Host) *Link {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.links[linkKey(a, c)]
}

func linkKey(a, c *Host) string {
	if a.n > c.n {
		a, c = c, a
	}
	return a.Name + "|" + c.Name
}

// up sets both ends up and routes each host's address over the link.
func (l *Link) up() error {
	for _, side := range []struct {
		h, peer *Host
		dev     string
	}{{l.A, l.B, l.devA}, {l.B, l.A, l.devB}} {
		if err := run("ip", "-n", side.h.NS, "link", "set", side.dev, "up"); err != nil {
			return err
		}
		if err := run("ip", "-n", side.h.NS, "route", "replace", side.peer.Addr+"/32", "dev", side.dev, "src", side.h.Addr); err != nil {
			return err
		}
	}
	return nil
}

// Cut partitions the two hosts: B's end goes down, so what A sends is
// dropped on the wire and B cannot send at all. Established connections
// see silence, new ones time out.
func (l *Link) Cut() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return nil
	}
	if err := run("ip", "-n", l.B.NS, "link", "set", l.devB, "down"); err != nil {
		return err
	}
	l.cut = true
	return nil
}

// Heal undoes Cut.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		return nil
	}
	if err := l.up(); err != nil {
		return err
	}
	l.cut = false
	return nil
}

// Delay adds d of latency each way (netem on both ends); 0 removes it.
func (l *Link) Delay(d time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, side := range []struct {
		h   *Host
		dev string
	}{{l.A, l.devA}, {l.B, l.devB}} {
		if d == 0 {
			if l.netem {
				run("tc", "-n", side.h.NS, "qdisc", "del", "dev", side.dev, "root")
			}
			continue
		}
		err := run("tc", "-n", side.h.NS, "qdisc", "replace", "dev", side.dev, "root", "netem", "delay", fmt.Sprintf("%dms", d.Milliseconds()))
		if err != nil && strings.Contains(err.Error(), "qdisc kind is unknown") {
			return ErrNoNetem
		}
		if err != nil {
			return err
		}
	}
	l.netem = d != 0
	return nil
}

// NetemAvailable says whether Delay can work on this kernel.
func (b *Bed) NetemAvailable() bool {
	a, err := b.Host("netem-a")
	if err != nil {
		return false
	}
	c, err := b.Host("netem-b")
	if err != nil {
		return false
	}
	l, err := b.Connect(a, c)
	if err != nil {
		return false
	}
	return l.Delay(time.Millisecond) == nil
}

// Command returns cmd name args run on host h.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Listen opens a TCP listener inside h's namespace (on h's address when
// addr names no host): a server of the test process itself (the Consul
// double) then lives on that host, behind its links.
func (h *Host) Listen(addr string) (net.Listener, error) {
	if strings.HasPrefix(addr, ":") {
		addr = h.Addr + addr
	}
	var l net.Listener
	err := h.inNS(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// DialContext dials from inside h's namespace: a client of the test process
// (load, checks) then sits on that host.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.inNS(func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// inNS runs fn on an OS thread switched into h's namespace; sockets fn
// makes stay in it. The thread is switched back before it is released (or
// dropped with its goroutine when that fails).
func (h *Host) inNS(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netbed: %w", err)
	}
	defer self.Close()
	target, err := os.Open(filepath.Join("/run/netns", h.NS))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netbed: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netbed: enter %s: %w", h.NS, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with this goroutine instead of
		// serving others in the wrong namespace.
		return fmt.Errorf("netbed: leave %s: %w", h.NS, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Close removes every namespace of the bed (and with them their veths).
// Safe to call twice.
func (b *Bed) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	for _, h := range b.hosts {
		if err := run("ip", "netns", "del", h.NS); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
