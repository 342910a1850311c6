package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// ConsulKey is the KV key, under a router's Consul prefix, that holds the
// token file when the routers run on Consul.
const ConsulKey = "tokens"

// OpenConsul loads the token file from the Consul KV key and, once
// started, follows it with blocking queries: every router sees a change
// within one query round trip. A deleted key or an invalid version is
// logged and the last good set stays in use.
func OpenConsul(ctx context.Context, kv *consul.KV, key string, log *slog.Logger) (*Store, error) {
	name := "consul:" + key
	var index uint64
	read := func(ctx context.Context) ([]byte, error) {
		pair, meta, err := kv.Get(key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if pair == nil {
			return nil, fmt.Errorf("%s does not exist (consul kv put %s @tokens.yaml)", name, key)
		}
		index = meta.LastIndex
		return pair.Value, nil
	}
	s, err := newStore(ctx, name, read, log)
	if err != nil {
		return nil, err
	}
	s.read = func(ctx context.Context) ([]byte, error) {
		pair, _, err := kv.Get(key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
		if err == nil && pair == nil {
			err = errors.New("key deleted")
		}
		if err != nil {
			return nil, err
		}
		return pair.Value, nil
	}
	s.follow = func(ctx context.Context) {
		idx := index
		for ctx.Err() == nil {
			pair, meta, err := kv.Get(key, (&consul.QueryOptions{WaitIndex: idx, WaitTime: time.Minute}).WithContext(ctx))
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.log.Warn("token file in Consul unreadable; keeping the tokens in use", "key", key, "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			if meta.LastIndex < idx {
				idx = 0 // Consul's index went back (a restored snapshot): start over
			} else {
				idx = meta.LastIndex
			}
			if pair == nil {
				s.log.Error("token file deleted from Consul; keeping the tokens in use", "key", key)
				continue
			}
			s.apply(pair.Value)
		}
	}
	return s, nil
}
