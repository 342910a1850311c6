package testbed

import (
	"fmt"
	"syscall"
	"time"
)

// Suspend stops inst with SIGSTOP and returns once the kernel shows it
// stopped: the process keeps its port and its connections but answers
// nothing, as a hung server (or one across a partition that drops packets)
// looks to a client. Continue resumes it; Stop and Restart continue it
// before they shut it down.
func (b *Bed) Suspend(inst *Instance) error {
	if err := b.signal(inst, syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(killWait)
	for !isStopped(inst.PID) {
		if time.Now().After(deadline) {
			return fmt.Errorf("testbed: %s (pid %d) not stopped %s after SIGSTOP", inst.Name, inst.PID, killWait)
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// Continue resumes an instance Suspend stopped (SIGCONT).
func (b *Bed) Continue(inst *Instance) error {
	return b.signal(inst, syscall.SIGCONT)
}

func (b *Bed) signal(inst *Instance, sig syscall.Signal) error {
	p, err := b.ownProcess(inst)
	if err != nil {
		return err
	}
	if !p.running() {
		return fmt.Errorf("testbed: %s is not running", inst.Name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("testbed: %s: %v: %w", inst.Name, sig, err)
	}
	return nil
}
