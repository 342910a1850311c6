package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"gopkg.in/yaml.v3"
)

// SandboxAddCluster starts one more cluster (a primary and spec.Replicas
// replicas, detached) beside the running sandbox in dir, named after the
// last one (c3 after c1 and c2), creates the sandbox database on it, adds
// it to dir/testbed.json (so `sandbox down` stops it too) and appends it to
// dir/topology.yaml owning no vshards: a router following the file
// connects to it, and a resharding job can then move vshards onto it. The
// rest of the topology file, shard map included, is left as it is.
func SandboxAddCluster(ctx context.Context, dir string, spec Spec, out io.Writer) (*Cluster, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("testbed: sandbox dir: %w", err)
	}
	desc := filepath.Join(dir, DescriptionFile)
	old, err := Attach(desc)
	if err != nil {
		return nil, fmt.Errorf("testbed: no sandbox in %s to add to: %w", dir, err)
	}
	if !old.running() {
		return nil, fmt.Errorf("testbed: the sandbox in %s is not running", dir)
	}
	next := 1
	for _, c := range old.Clusters {
		if n, err := strconv.Atoi(c.Name[1:]); err == nil && n >= next {
			next = n + 1
		}
	}
	spec.Clusters, spec.Dir, spec.Detach = 1, dir, true
	spec = sandboxSized(spec)
	spec.firstCluster, spec.replPassword = next, old.replPassword
	b, err := Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) {
		err = errors.Join(err, b.Stop())
		for _, inst := range b.Instances() {
			os.RemoveAll(inst.dir())
		}
		return nil, err
	}
	if err := CreateDatabase(ctx, b, SandboxDatabase); err != nil {
		return fail(err)
	}
	if err := WaitReplicated(ctx, b); err != nil {
		return fail(err)
	}
	c := b.Clusters[0]
	topo := filepath.Join(dir, TopologyFile)
	if err := appendCluster(topo, c, SandboxDatabase); err != nil {
		return fail(err)
	}
	old.Clusters = append(old.Clusters, c)
	if err := old.Save(desc); err != nil {
		return fail(err)
	}
	fmt.Fprintf(out, "sandbox: cluster %s added (primary %s, %d replicas); it owns no vshards yet in %s\n", c.Name, c.Primary.Addr(), len(c.Replicas), topo)
	return c, nil
}

// appendCluster adds c to the clusters of the topology file at path,
// keeping every other node (and comment) of the file.
func appendCluster(path string, c *Cluster, database string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("testbed: read topology: %w", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("testbed: read topology %s: %w", path, err)
	}
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("testbed: topology %s is not a YAML mapping", path)
	}
	entry := struct {
		Name     string   `yaml:"name"`
		Primary  string   `yaml:"primary"`
		Replicas []string `yaml:"replicas"`
	}{Name: c.Name, Primary: c.Primary.DSN(database), Replicas: []string{}}
	for _, r := range c.Replicas {
		entry.Replicas = append(entry.Replicas, r.DSN(database))
	}
	var node yaml.Node
	if err := node.Encode(entry); err != nil {
		return err
	}
	top := root.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "clusters" && top.Content[i+1].Kind == yaml.SequenceNode {
			top.Content[i+1].Content = append(top.Content[i+1].Content, &node)
			out, err := yaml.Marshal(&root)
			if err != nil {
				return err
			}
			tmp := path + ".tmp"
			if err := os.WriteFile(tmp, out, 0o644); err != nil {
				return fmt.Errorf("testbed: write topology: %w", err)
			}
			return os.Rename(tmp, path)
		}
	}
	return fmt.Errorf("testbed: topology %s has no clusters list", path)
}
