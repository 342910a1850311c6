package topology

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"
)

// FileDoc is a document kept in a file and replaced with check-and-set
// among the callers of one FileDoc: what the static topology offers the
// resharding jobs (rebalance.StateDoc) through FileBackend.ReshardState.
// The file is replaced through a temporary file and a rename, so a reader
// sees the old or the new document; a JSON document is written indented,
// for an operator to read. As for the topology file, another process
// writing the file at the same moment is not excluded.
type FileDoc struct {
	Path string
	mu   sync.Mutex
}

// ReshardState returns the document of the resharding jobs: the file
// beside the topology file, its path + ".reshard.json". Every call
// returns the same FileDoc.
func (f *FileBackend) ReshardState() *FileDoc {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reshard == nil {
		f.reshard = &FileDoc{Path: f.Path + ".reshard.json"}
	}
	return f.reshard
}

// Get returns the file's content (nil when there is no file) and its
// revision: 0 for no file, else a hash of the content.
func (d *FileDoc) Get(context.Context) ([]byte, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.read()
}

func (d *FileDoc) read() ([]byte, uint64, error) {
	data, err := os.ReadFile(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", d.Path, err)
	}
	h := fnv.New64a()
	h.Write(data)
	return data, h.Sum64() | 1, nil // never 0, the revision of no file
}

// CompareAndSwap writes data when the file is still at revision rev.
func (d *FileDoc) CompareAndSwap(_ context.Context, rev uint64, data []byte) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, cur, err := d.read()
	if err != nil {
		return false, err
	}
	if cur != rev {
		return false, nil
	}
	var indented bytes.Buffer
	if json.Indent(&indented, data, "", "  ") == nil {
		data = indented.Bytes()
	}
	return true, writeFileAtomic(d.Path, data)
}

// writeFileAtomic replaces path by data through a temporary file in the
// same directory and a rename.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
