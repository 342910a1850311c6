package client_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// codesIn reads the string values of the Code* constants declared in file.
func codesIn(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "Code") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, _ := strconv.Unquote(lit.Value)
					out[v] = true
				}
			}
		}
	}
	return out
}

// The client may not import the router, so it keeps its own copy of the
// error codes; this holds the copy to the router's list (api/errors.go),
// both ways, so a new code cannot reach the wire unknown to the client.
func TestErrorCodesMatchTheRouters(t *testing.T) {
	router, ours := codesIn(t, "../api/errors.go"), codesIn(t, "errors.go")
	if len(router) == 0 {
		t.Fatal("no Code* constants found in api/errors.go")
	}
	if !maps.Equal(router, ours) {
		var missing, extra []string
		for c := range router {
			if !ours[c] {
				missing = append(missing, c)
			}
		}
		for c := range ours {
			if !router[c] {
				extra = append(extra, c)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		t.Fatalf("client codes differ from the router's: missing %v, unknown to the router %v", missing, extra)
	}
}
