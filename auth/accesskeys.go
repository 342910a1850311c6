package auth

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"gopkg.in/yaml.v3"
)

// Access keys are the SQS API's credentials (docs/security.md, "SQS"). An
// AWS Signature Version 4 is an HMAC keyed by the secret itself, so the
// router must hold each secret in clear to check one — unlike its bearer
// tokens, of which it keeps only hashes. They therefore live in a file of
// their own, which the router refuses to read unless only its owner can,
// and each key acts as a token of the token file: the key names the token,
// whose scopes and rate apply to every call signed with it, so that one
// place grants and revokes (removing the token disables its keys).
//
//	keys:
//	  - access_key_id: SMQ4K2Q7…            # [A-Z0-9]{16,128}, unique
//	    secret_access_key: 0n4Yb…           # at least 40 characters
//	    token: billing                      # a token of the token file
type AccessKeyFile struct {
	Keys []AccessKey `yaml:"keys"`
}

// AccessKey is one entry of the access-key file.
type AccessKey struct {
	ID     string `yaml:"access_key_id"`
	Secret string `yaml:"secret_access_key"`
	Token  string `yaml:"token"`
}

var accessKeyRE = regexp.MustCompile(`^[A-Z0-9]{16,128}$`)

// minSecret is the shortest secret accepted: AWS's own are 40 characters.
const minSecret = 40

// ParseAccessKeys reads an access-key file's content; errors name the
// file and the entry.
func ParseAccessKeys(path string, data []byte) (map[string]AccessKey, error) {
	var f AccessKeyFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string]AccessKey, len(f.Keys))
	for i, k := range f.Keys {
		where := fmt.Sprintf("%s: keys[%d]", path, i)
		switch {
		case !accessKeyRE.MatchString(k.ID):
			return nil, fmt.Errorf("%s: access_key_id must match %s", where, accessKeyRE)
		case out[k.ID].ID != "":
			return nil, fmt.Errorf("%s: access_key_id %s is used twice", where, k.ID)
		case len(k.Secret) < minSecret:
			return nil, fmt.Errorf("%s (%s): secret_access_key must have at least %d characters", where, k.ID, minSecret)
		case !nameRE.MatchString(k.Token):
			return nil, fmt.Errorf("%s (%s): token must name a token of the token file", where, k.ID)
		}
		out[k.ID] = k
	}
	return out, nil
}

// NewAccessKey returns a fresh access key id ("SMQ" and 17 random
// characters of A-Z2-7, 20 in all like AWS's) and secret (40 characters
// of URL-safe base64: 240 random bits).
func NewAccessKey() (id, secret string, err error) {
	var b [30 + 17]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("new access key: %w", err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	idb := []byte("SMQ")
	for _, c := range b[30:] {
		idb = append(idb, alphabet[c&31])
	}
	return string(idb), base64.RawURLEncoding.EncodeToString(b[:30]), nil
}

// PutAccessKey adds k to the access-key file at path (mode 0600, created
// when missing), replacing entries of the same token when replace is set.
// The file is replaced in one rename.
func PutAccessKey(path string, k AccessKey, replace bool) error {
	var f AccessKeyFile
	if err := readYAML(path, "access-key file", &f); err != nil {
		return err
	}
	kept := f.Keys[:0]
	for _, e := range f.Keys {
		if e.ID != k.ID && !(replace && e.Token == k.Token) {
			kept = append(kept, e)
		}
	}
	f.Keys = append(kept, k)
	out, err := yaml.Marshal(f)
	if err != nil {
		return fmt.Errorf("access-key file: %w", err)
	}
	if _, err := ParseAccessKeys(path, out); err != nil {
		return err
	}
	out = append([]byte("# shardmq SQS access keys: secrets in clear, readable by the router's user only (docs/security.md)\n"), out...)
	return writePrivate(path, out)
}

// readYAML reads the YAML file at path into v; a missing file leaves v
// as it is. what names the file in errors.
func readYAML(path, what string, v any) error {
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := yaml.Unmarshal(data, v); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	case !os.IsNotExist(err):
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// writePrivate writes data to path readable by its owner only, in one
// rename.
func writePrivate(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// WriteSharedCredentials writes an AWS shared-credentials file (the INI
// file SDKs and the AWS CLI read) at path, mode 0600, with one profile.
// The profile also names a region (the router signs and accepts any):
// botocore — the AWS CLI v1 and boto3, which do not read AWS_REGION —
// takes a profile's settings from the credentials file too, so
// AWS_SHARED_CREDENTIALS_FILE alone is enough for them; the Go SDK and the
// AWS CLI v2 ignore it there and take AWS_REGION.
func WriteSharedCredentials(path, profile, id, secret string) error {
	return writePrivate(path, fmt.Appendf(nil, "[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\nregion = us-east-1\n", profile, id, secret))
}

// AccessKeys is the access-key file in use, reloaded when it changes (a
// valid new version replaces the keys at once; an invalid or
// group/other-readable one is logged and the last good keys stay).
type AccessKeys struct {
	path  string
	every time.Duration
	log   *slog.Logger
	keys  atomic.Pointer[map[string]AccessKey]

	mu     sync.Mutex
	loaded []byte
	cancel context.CancelFunc
	done   chan struct{}
}

// OpenAccessKeys loads the access-key file at path; Start follows its
// changes, checked every every (1s when zero).
func OpenAccessKeys(path string, every time.Duration, log *slog.Logger) (*AccessKeys, error) {
	if every <= 0 {
		every = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &AccessKeys{path: path, every: every, log: log}
	data, err := a.read()
	if err != nil {
		return nil, err
	}
	keys, err := ParseAccessKeys(path, data)
	if err != nil {
		return nil, fmt.Errorf("access-key file: %w", err)
	}
	a.keys.Store(&keys)
	a.loaded = data
	return a, nil
}

// read reads the file, refusing one that others than its owner may read.
func (a *AccessKeys) read() ([]byte, error) {
	st, err := os.Stat(a.path)
	if err != nil {
		return nil, fmt.Errorf("access-key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("access-key file %s: mode %v lets others read its secrets; chmod 600 it", a.path, st.Mode().Perm())
	}
	data, err := os.ReadFile(a.path)
	if err != nil {
		return nil, fmt.Errorf("access-key file: %w", err)
	}
	return data, nil
}

// Lookup finds an access key by id.
func (a *AccessKeys) Lookup(id string) (AccessKey, bool) {
	k, ok := (*a.keys.Load())[id]
	return k, ok
}

// Reload reads the file now and applies it if it changed and is valid.
func (a *AccessKeys) Reload() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	data, err := a.read()
	if err != nil {
		a.log.Error("access-key file unreadable; keeping the keys in use", "err", err)
		return false
	}
	if bytes.Equal(data, a.loaded) {
		return false
	}
	a.loaded = data
	keys, err := ParseAccessKeys(a.path, data)
	if err != nil {
		a.log.Error("access-key file invalid; keeping the keys in use", "err", err)
		return false
	}
	a.keys.Store(&keys)
	a.log.Info("access-key file reloaded", "file", a.path, "keys", len(keys))
	return true
}

// Start follows the file until Stop. Calling it twice is harmless.
func (a *AccessKeys) Start(ctx context.Context) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancel != nil {
		return
	}
	ctx, a.cancel = context.WithCancel(ctx)
	a.done = make(chan struct{})
	go func() {
		defer close(a.done)
		t := time.NewTicker(a.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				a.Reload()
			}
		}
	}()
}

// Stop ends the watch and waits for it. Safe to call twice, or without
// Start.
func (a *AccessKeys) Stop() {
	a.mu.Lock()
	cancel, done := a.cancel, a.done
	a.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}
