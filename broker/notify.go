package broker

import "sync"

// notifier wakes long-polling claimers of a topic when this router has
// produced to it. Each waiter takes the topic's current channel before it
// polls; signal closes it and installs a fresh one, so no wake-up between
// poll and wait is missed and a slow waiter never blocks the producer.
type notifier struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: map[string]chan struct{}{}} }

func (n *notifier) channel(topic string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.ch[topic]
	if !ok {
		c = make(chan struct{})
		n.ch[topic] = c
	}
	return c
}

func (n *notifier) signal(topic string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.ch[topic]; ok {
		close(c)
		delete(n.ch, topic)
	}
}
