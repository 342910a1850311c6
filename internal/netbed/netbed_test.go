package netbed

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

func setup(t *testing.T) *Bed {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("partition tests need network namespaces: %v", err)
	}
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// Two hosts talk over their link; a cut silences it (a connect times out,
// nobody is told), a heal restores it; a third host's link is untouched.
func TestCutAndHeal(t *testing.T) {
	b := setup(t)
	a, err := b.Host("a")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := b.Host("c")
	d, _ := b.Host("d")
	ac, err := b.Connect(a, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Connect(a, d); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*Host{c, d} {
		ln, err := h.Listen(":7000")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte("hi"))
				conn.Close()
			}
		}()
	}
	dial := func(h *Host) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := a.DialContext(ctx, "tcp", h.Addr+":7000")
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = io.ReadAll(conn)
		return err
	}
	if err := dial(c); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	if err := ac.Cut(); err != nil {
		t.Fatal(err)
	}
	// The dialer sets the socket's deadline to the context's, so either
	// may fire first: a timeout either way, never a refusal.
	if err := dial(c); !isTimeout(err) {
		t.Fatalf("dial across a cut link: %v, want a timeout", err)
	}
	if err := dial(d); err != nil {
		t.Fatalf("another link during the cut: %v", err)
	}
	if err := ac.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := dial(c); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
	if err := ac.Delay(50 * time.Millisecond); errors.Is(err, ErrNoNetem) {
		t.Logf("no netem on this kernel: delays are not tested")
		return
	} else if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := dial(c); err != nil || time.Since(began) < 100*time.Millisecond {
		t.Fatalf("dial over a link of 50ms each way: %v after %v", err, time.Since(began))
	}
}
