package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardmq/shardmq/routing"
)

// fileDoc is the YAML layout of a static topology file.
type fileDoc struct {
	Clusters []struct {
		Name     string   `yaml:"name"`
		Primary  string   `yaml:"primary"`
		Replicas []string `yaml:"replicas"`
	} `yaml:"clusters"`
	ShardMap struct {
		Version int64           `yaml:"version"`
		Ranges  []routing.Range `yaml:"ranges"`
	} `yaml:"shard_map"`
	// Archive is the archive cluster of retention (docs/retention.md).
	Archive *struct {
		Primary  string   `yaml:"primary"`
		Replicas []string `yaml:"replicas"`
	} `yaml:"archive"`
}

// LoadFile reads and validates a static topology file.
func LoadFile(path string) (*Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	return Parse(path, data)
}

// Parse validates a static topology document; name is used in errors.
func Parse(name string, data []byte) (*Topology, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &fieldError{file: name, msg: err.Error()}
	}
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, &fieldError{file: name, msg: err.Error()}
	}
	lines := lineIndex(&root)
	fail := func(field, msg string) error {
		return &fieldError{file: name, line: lines[field], field: field, msg: msg}
	}

	t := &Topology{Clusters: map[string]Cluster{}}
	if len(doc.Clusters) == 0 {
		return nil, fail("clusters", "at least one cluster is required")
	}
	known := map[string]bool{}
	for i, c := range doc.Clusters {
		field := fmt.Sprintf("clusters[%d]", i)
		switch {
		case !NameRE.MatchString(c.Name):
			return nil, fail(field+".name", fmt.Sprintf("%q is not a valid cluster name (%s)", c.Name, NameRE))
		case c.Name == ArchiveName:
			return nil, fail(field+".name", fmt.Sprintf("%q names the archive cluster; list it under archive:", c.Name))
		case known[c.Name]:
			return nil, fail(field+".name", fmt.Sprintf("cluster %q is listed twice", c.Name))
		case c.Primary == "":
			return nil, fail(field+".primary", "primary DSN is required")
		}
		known[c.Name] = true
		t.Clusters[c.Name] = Cluster{Name: c.Name, Primary: c.Primary, Replicas: append([]string(nil), c.Replicas...)}
	}
	if doc.ShardMap.Version < 1 {
		return nil, fail("shard_map.version", "version must be 1 or more")
	}
	m, err := routing.NewMap(doc.ShardMap.Version, doc.ShardMap.Ranges, known)
	if err != nil {
		var re *routing.RangeError
		if errors.As(err, &re) && re.Index >= 0 {
			return nil, fail(fmt.Sprintf("shard_map.ranges[%d]", re.Index), re.Msg)
		}
		return nil, fail("shard_map.ranges", err.Error())
	}
	t.Map = m
	if a := doc.Archive; a != nil {
		if a.Primary == "" {
			return nil, &fieldError{file: name, line: lines["archive"], field: "archive.primary", msg: "primary DSN is required"}
		}
		t.Archive = &Cluster{Name: ArchiveName, Primary: a.Primary, Replicas: append([]string(nil), a.Replicas...)}
	}
	return t, nil
}

// ArchiveName is the name the archive cluster goes by: in answers, and as
// the cluster meta of its instances in Consul.
const ArchiveName = "archive"

// lineIndex maps dotted field paths (clusters[0].name, shard_map.ranges[2])
// to the line they start on, so errors can point at the file.
func lineIndex(root *yaml.Node) map[string]int {
	out := map[string]int{}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				p := n.Content[i].Value
				if path != "" {
					p = path + "." + p
				}
				out[p] = n.Content[i].Line
				walk(n.Content[i+1], p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				out[p] = c.Line
				walk(c, p)
			}
		}
	}
	walk(root, "")
	return out
}

// WatchFile polls path and calls apply with every new valid topology,
// starting from the file content from (read at once when nil), so that a
// change made after from was read is not missed. An invalid file is logged
// and ignored: the router keeps the last good one. It returns when ctx is
// done.
func WatchFile(ctx context.Context, path string, every time.Duration, log *slog.Logger, from []byte, apply func(*Topology)) {
	watchFile(ctx, path, every, log, from, apply, nil)
}

// watchFile is WatchFile that also reads the file at once when poke
// fires (a write by this process).
func watchFile(ctx context.Context, path string, every time.Duration, log *slog.Logger, from []byte, apply func(*Topology), poke <-chan struct{}) {
	last := from
	if last == nil {
		last, _ = os.ReadFile(path)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-poke:
		}
		data, err := os.ReadFile(path)
		if err != nil {
			log.Warn("topology file unreadable; keeping the last good one", "path", path, "err", err)
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last = data
		t, err := Parse(path, data)
		if err != nil {
			log.Error("topology file rejected; keeping the last good one", "err", err)
			continue
		}
		log.Info("topology file reloaded", "path", path, "shard_map_version", t.Map.Version())
		apply(t)
	}
}
