// Package docs_test checks the repository's documentation: every link in
// README.md and docs/*.md points at a file or directory of the repository
// (a clone has nothing else), and the design page that the README names
// exists.
package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// link is a Markdown link or image target: ](target) or ](target#anchor).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestDocsLinkOnlyInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	checked := 0
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for n, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				where := filepath.Base(page) + ":" + strconv.Itoa(n+1)
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					t.Errorf("%s: %s links outside the repository", where, target)
					continue
				}
				path, _, _ := strings.Cut(target, "#")
				if path == "" {
					continue // an anchor on the same page
				}
				abs := filepath.Clean(filepath.Join(filepath.Dir(page), path))
				if rel, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(rel, "..") {
					t.Errorf("%s: %s leaves the repository", where, target)
					continue
				}
				if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s: %s: %v", where, target, err)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links found: the scan is broken")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "](docs/design.md)") {
		t.Error("README.md does not point at docs/design.md")
	}
}
