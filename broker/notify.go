package broker

import "sync"

// notifier wakes long-polling claimers of a topic when this router has
// produced to it. Each waiter registers with wait before it polls and gets
// the topic's current channel; signal closes it, so no wake-up between
// poll and wait is missed and a slow waiter never blocks the producer.
//
// A topic's entry lives only while someone waits on it: the last waiter's
// release removes it, and signal removes the entry it closes. Claims on
// any number of distinct topic names therefore leave nothing behind.
type notifier struct {
	mu sync.Mutex
	ch map[string]*waiters
}

// waiters is one topic's channel and how many claimers hold it.
type waiters struct {
	ch chan struct{}
	n  int
}

func newNotifier() *notifier { return &notifier{ch: map[string]*waiters{}} }

// wait registers a waiter on topic. The channel is closed by the next
// signal of topic; release must be called once the waiter is done with it.
func (n *notifier) wait(topic string) (<-chan struct{}, func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, ok := n.ch[topic]
	if !ok {
		w = &waiters{ch: make(chan struct{})}
		n.ch[topic] = w
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			w.n--
			if w.n == 0 && n.ch[topic] == w {
				delete(n.ch, topic)
			}
		})
	}
}

func (n *notifier) signal(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if w, ok := n.ch[topic]; ok {
		close(w.ch)
		delete(n.ch, topic)
	}
}

// size is how many topics have waiters (tests, metrics).
func (n *notifier) size() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.ch)
}
