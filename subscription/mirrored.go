package subscription

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
)

// Mirrored keeps subscriptions in two stores: Shared, the one every router
// reads (Consul KV), and Durable, the clusters' own copy (MySQLStore) that
// outlives a loss of Shared's data. A write goes to Durable first, then to
// Shared. List reads both and repairs Shared from Durable: a subscription
// Durable holds and Shared lost is written back to Shared, one that
// Durable deleted is deleted from Shared too, and one that only Shared
// holds (made before the mirror existed) is copied to Durable. When Shared
// cannot be read, List answers from Durable alone.
type Mirrored struct {
	Shared  Store
	Durable *MySQLStore
	// Log defaults to discarding.
	Log *slog.Logger
}

var _ Store = (*Mirrored)(nil)

func (m *Mirrored) log() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}

// Put implements Store.
func (m *Mirrored) Put(ctx context.Context, s Subscription) error {
	if err := m.Durable.Put(ctx, s); err != nil {
		return err
	}
	return m.Shared.Put(ctx, s)
}

// Delete implements Store.
func (m *Mirrored) Delete(ctx context.Context, topic, name string) (bool, error) {
	had, err := m.Durable.Delete(ctx, topic, name)
	if err != nil {
		return false, err
	}
	shared, err := m.Shared.Delete(ctx, topic, name)
	return had || shared, err
}

// List implements Store.
func (m *Mirrored) List(ctx context.Context) ([]Subscription, error) {
	durable, derr := m.Durable.List(ctx)
	shared, serr := m.Shared.List(ctx)
	if serr != nil {
		if durable == nil {
			return nil, errors.Join(serr, derr)
		}
		return durable, fmt.Errorf("shared subscription store unreadable, answering from the clusters: %w", serr)
	}
	if derr != nil {
		// Some cluster did not answer: repairing from a partial view
		// could undo a change it holds. Serve Shared as it is.
		return shared, nil
	}
	byKey := map[[2]string]Subscription{}
	for _, s := range shared {
		byKey[[2]string{s.Topic, s.Name}] = s
	}
	out := make([]Subscription, 0, len(durable))
	for _, d := range durable {
		k := [2]string{d.Topic, d.Name}
		s, ok := byKey[k]
		delete(byKey, k)
		out = append(out, d)
		if ok && sameConfig(s, d) {
			continue
		}
		m.log().Warn("subscription missing or different in the shared store; writing the clusters' copy back", "topic", d.Topic, "subscription", d.Name)
		if err := m.Shared.Put(ctx, d); err != nil {
			m.log().Warn("subscription not written back", "topic", d.Topic, "subscription", d.Name, "err", err)
		}
	}
	for k, s := range byKey {
		known, err := m.Durable.known(ctx, k[0], k[1])
		switch {
		case err != nil:
			out = append(out, s) // cannot tell: keep serving it
		case known: // deleted on the clusters: finish the delete
			if _, err := m.Shared.Delete(ctx, k[0], k[1]); err != nil {
				m.log().Warn("deleted subscription not removed from the shared store", "topic", k[0], "subscription", k[1], "err", err)
			}
		default: // made before the mirror: copy it to the clusters
			if err := m.Durable.Put(ctx, s); err != nil {
				m.log().Warn("subscription not copied to the clusters", "topic", k[0], "subscription", k[1], "err", err)
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// sameConfig compares two copies of a subscription, creation time aside
// (each store keeps its own).
func sameConfig(a, b Subscription) bool {
	a.CreatedAt = b.CreatedAt
	x, _ := json.Marshal(a.WithDefaults())
	y, _ := json.Marshal(b.WithDefaults())
	return bytes.Equal(x, y)
}
