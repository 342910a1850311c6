package client_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNothingOfTheRouter: the client and its outbox and inbox are
// for services; they must not pull in the router's packages (and the
// client itself nothing but the standard library and its own internal
// packages, which import only the standard library).
func TestImportsNothingOfTheRouter(t *testing.T) {
	std := func(p string) bool { return !strings.Contains(strings.SplitN(p, "/", 2)[0], ".") }
	own := func(p string) bool { return strings.HasPrefix(p, "github.com/shardmq/shardmq/client/internal/") }
	allowed := map[string]func(string) bool{
		".": func(p string) bool { return std(p) || own(p) },
		"outbox": func(p string) bool {
			return p == "github.com/shardmq/shardmq/client" || p == "github.com/go-sql-driver/mysql" || std(p) || own(p)
		},
		"inbox":            func(p string) bool { return p == "github.com/shardmq/shardmq/client" || std(p) || own(p) },
		"internal/backoff": std,
	}
	for dir, ok := range allowed {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range file.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if !ok(p) {
					t.Errorf("%s imports %s", f, p)
				}
			}
		}
	}
}
