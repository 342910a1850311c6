package observe

import "sync"

// Other is the label value that topics and subscriptions beyond the cap
// share.
const Other = "_other"

// Labels hands out bounded topic and subscription label values: the first
// max topics seen get their own value, and so do the first max
// topic/subscription pairs (of topics that have their own); everything
// else is labelled Other (a pair: Other, Other). A metric labelled by
// topic, or by topic and subscription, thus has at most max+1 series per
// value of its other labels. Forget frees a pair's place (its
// subscription was deleted).
type Labels struct {
	max    int
	mu     sync.RWMutex
	topics map[string]bool
	pairs  map[[2]string]bool
}

// NewLabels returns label values capped at n (at least 1).
func NewLabels(n int) *Labels {
	return &Labels{max: max(n, 1), topics: map[string]bool{}, pairs: map[[2]string]bool{}}
}

// Topic returns the label value of topic, admitting it while there is
// room.
func (l *Labels) Topic(topic string) string {
	l.mu.RLock()
	ok := l.topics[topic]
	l.mu.RUnlock()
	if ok {
		return topic
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.topicLocked(topic)
}

func (l *Labels) topicLocked(topic string) string {
	if l.topics[topic] {
		return topic
	}
	if len(l.topics) >= l.max {
		return Other
	}
	l.topics[topic] = true
	return topic
}

// Pair returns the label values of a subscription: its own while it has
// a place (or gets one), else (Other, Other).
func (l *Labels) Pair(topic, sub string) (string, string) {
	k := [2]string{topic, sub}
	l.mu.RLock()
	ok := l.pairs[k]
	l.mu.RUnlock()
	if ok {
		return topic, sub
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.topicLocked(topic) == Other {
		return Other, Other
	}
	if l.pairs[k] {
		return topic, sub
	}
	if len(l.pairs) >= l.max {
		return Other, Other
	}
	l.pairs[k] = true
	return topic, sub
}

// Forget frees the place of a subscription and says whether it had one
// (its series are then to be deleted).
func (l *Labels) Forget(topic, sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := [2]string{topic, sub}
	had := l.pairs[k]
	delete(l.pairs, k)
	return had
}

// Pairs lists the subscriptions that have a place.
func (l *Labels) Pairs() [][2]string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([][2]string, 0, len(l.pairs))
	for k := range l.pairs {
		out = append(out, k)
	}
	return out
}
