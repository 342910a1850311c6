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
// client itself nothing but the standard library and the shared retry
// waits, internal/backoff and internal/ctxwait, which import only the
// standard library).
func TestImportsNothingOfTheRouter(t *testing.T) {
	std := func(p string) bool { return !strings.Contains(strings.SplitN(p, "/", 2)[0], ".") }
	// The retry waits the router uses too: small packages of the standard
	// library alone (checked below), not the router.
	shared := func(p string) bool {
		return p == "github.com/shardmq/shardmq/internal/backoff" || p == "github.com/shardmq/shardmq/internal/ctxwait"
	}
	allowed := map[string]func(string) bool{
		".": func(p string) bool { return std(p) || shared(p) },
		"outbox": func(p string) bool {
			return p == "github.com/shardmq/shardmq/client" || p == "github.com/go-sql-driver/mysql" || std(p) || shared(p)
		},
		"inbox":               func(p string) bool { return p == "github.com/shardmq/shardmq/client" || std(p) || shared(p) },
		"../internal/backoff": func(p string) bool { return std(p) || shared(p) },
		"../internal/ctxwait": std,
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
