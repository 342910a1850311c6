package topology

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardmq/shardmq/routing"
)

// FileBackend is the static topology file as a Backend, for a single
// router: shard-map updates rewrite the file's shard_map section (keeping
// the rest of the file, comments included), registrations live in this
// process, and the router always leads.
//
// The check-and-set of UpdateShardMap is exact among the callers of one
// FileBackend; another process editing the file at the same moment is not
// excluded (the static file serves one router).
type FileBackend struct {
	Path  string
	Every time.Duration // how often the file is checked; defaults to 1s
	Log   *slog.Logger

	mu      sync.Mutex // serializes UpdateShardMap; guards regs, changed, loaded and reshard
	regs    map[*fileRegistration]AppliedMap
	changed chan struct{} // closed and replaced when a registration changes
	loaded  []byte        // the file as Load last read it
	written chan struct{} // buffered 1: UpdateShardMap wrote the file; Watch reads it at once
	reshard *FileDoc      // ReshardState's, made on first use
}

var _ Backend = (*FileBackend)(nil)

// NewFileBackend returns the backend of the topology file at path, checked
// for changes every every (1s when zero).
func NewFileBackend(path string, every time.Duration, log *slog.Logger) *FileBackend {
	return &FileBackend{
		Path:    path,
		Every:   every,
		Log:     log,
		regs:    map[*fileRegistration]AppliedMap{},
		changed: make(chan struct{}),
		written: make(chan struct{}, 1),
	}
}

// Load implements Source, remembering the file it read so that Watch
// reports any change made after it.
func (f *FileBackend) Load(context.Context) (*Topology, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	t, err := Parse(f.Path, data)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.loaded = data
	f.mu.Unlock()
	return t, nil
}

// Watch implements Source: it polls the file every Every and applies every
// new valid version, starting from the file as Load read it (so a change
// made between Load and Watch is not missed). An invalid file is logged and
// skipped: the router keeps the last good topology.
func (f *FileBackend) Watch(ctx context.Context, apply func(*Topology)) {
	every, log := f.Every, f.Log
	if every <= 0 {
		every = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f.mu.Lock()
	last := f.loaded
	f.mu.Unlock()
	watchFile(ctx, f.Path, every, log, last, apply, f.written)
}

// ShardMap implements Backend.
func (f *FileBackend) ShardMap(context.Context) (*routing.Map, error) {
	t, err := LoadFile(f.Path)
	if err != nil {
		return nil, err
	}
	return t.Map, nil
}

// UpdateShardMap implements Backend: the file is rewritten through a
// temporary file and a rename, so a reader sees the old or the new file.
func (f *FileBackend) UpdateShardMap(_ context.Context, prev int64, next *routing.Map) error {
	if err := CheckNext(prev, next); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return fmt.Errorf("read topology: %w", err)
	}
	cur, err := Parse(f.Path, data)
	if err != nil {
		return fmt.Errorf("stored topology: %w", err)
	}
	if have := cur.Map.Version(); have != prev {
		return &ConflictError{Want: prev, Have: have}
	}
	if err := CheckAbove(next, f.appliedLocked()); err != nil {
		return err
	}
	out, err := replaceShardMap(data, next)
	if err != nil {
		return fmt.Errorf("rewrite %s: %w", f.Path, err)
	}
	if _, err := Parse(f.Path, out); err != nil {
		return fmt.Errorf("new shard map: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.Path), "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("write topology: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		return fmt.Errorf("write topology: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write topology: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write topology: %w", err)
	}
	if fi, err := os.Stat(f.Path); err == nil {
		os.Chmod(tmp.Name(), fi.Mode().Perm())
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("write topology: %w", err)
	}
	select {
	case f.written <- struct{}{}:
	default:
	}
	return nil
}

// ReplaceShardMap returns the YAML topology data with its shard_map
// section replaced by m, every other node (and comment) kept: how a tool
// that regenerates a topology file keeps the newer map of the file it
// replaces.
func ReplaceShardMap(data []byte, m *routing.Map) ([]byte, error) { return replaceShardMap(data, m) }

// replaceShardMap returns the YAML document data with its shard_map
// section replaced by m, every other node (and comment) kept.
func replaceShardMap(data []byte, m *routing.Map) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, err
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("not a YAML mapping")
	}
	var section yaml.Node
	doc := struct {
		Version int64           `yaml:"version"`
		Ranges  []routing.Range `yaml:"ranges"`
	}{m.Version(), m.Ranges()}
	if err := section.Encode(doc); err != nil {
		return nil, err
	}
	for _, n := range section.Content {
		if n.Kind == yaml.SequenceNode {
			for _, r := range n.Content {
				r.Style = yaml.FlowStyle
			}
		}
	}
	top := root.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "shard_map" {
			top.Content[i+1] = &section
			return yaml.Marshal(&root)
		}
	}
	key := &yaml.Node{Kind: yaml.ScalarNode, Value: "shard_map"}
	top.Content = append(top.Content, key, &section)
	return yaml.Marshal(&root)
}

// Register implements Backend. The registration lives in this process.
func (f *FileBackend) Register(ctx context.Context, id string) (Registration, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &fileRegistration{f: f, id: id}
	f.mu.Lock()
	f.regs[r] = AppliedMap{Router: id}
	f.signalLocked()
	f.mu.Unlock()
	context.AfterFunc(ctx, r.Stop)
	return r, nil
}

func (f *FileBackend) signalLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// WaitApplied implements Backend.
func (f *FileBackend) WaitApplied(ctx context.Context, version int64) error {
	for {
		f.mu.Lock()
		var behind []string
		for r, a := range f.regs {
			if a.Version < version {
				behind = append(behind, fmt.Sprintf("%s at %d", r.id, a.Version))
			}
		}
		changed := f.changed
		f.mu.Unlock()
		if len(behind) == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for shard map %d: routers behind: %v: %w", version, behind, ctx.Err())
		}
	}
}

// Applied implements Backend: the registrations of this process.
func (f *FileBackend) Applied(context.Context) ([]AppliedMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.appliedLocked(), nil
}

func (f *FileBackend) appliedLocked() []AppliedMap {
	out := make([]AppliedMap, 0, len(f.regs))
	for _, a := range f.regs {
		out = append(out, a)
	}
	return out
}

// Leader implements Backend: the single router always leads.
func (f *FileBackend) Leader(string) Leader { return NewSoleLeader() }

type fileRegistration struct {
	f  *FileBackend
	id string
}

func (r *fileRegistration) Publish(v int64) { r.publish(v, "") }

// PublishMap implements MapPublisher.
func (r *fileRegistration) PublishMap(m *routing.Map) { r.publish(m.Version(), m.Digest()) }

func (r *fileRegistration) publish(v int64, digest string) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if cur, ok := r.f.regs[r]; ok && (v > cur.Version || v == cur.Version && cur.Digest == "" && digest != "") {
		r.f.regs[r] = AppliedMap{Router: r.id, Version: v, Digest: digest}
		r.f.signalLocked()
	}
}

func (r *fileRegistration) Stop() {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if _, ok := r.f.regs[r]; ok {
		delete(r.f.regs, r)
		r.f.signalLocked()
	}
}
