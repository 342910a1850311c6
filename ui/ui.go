// Package ui is the operators' web page that the router serves at /ui
// (docs/ui.md): static files embedded in the binary, with no data of their
// own — the page asks for an admin token and reads everything from the
// authenticated JSON endpoints — and the History of queue counts behind
// its sparklines.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// CSP is the page's Content-Security-Policy: its own scripts, styles and
// fetches only, nothing inline, no frames, no forms, no other origin.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the page's files under /ui/ (and /ui, redirected).
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has it
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" {
			http.Redirect(w, r, "/ui/", http.StatusMovedPermanently)
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/ui/")
		if name == "" {
			name = "index.html"
		}
		data, err := fs.ReadFile(files, path.Clean(name))
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if err != nil {
			h.Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte("not found\n"))
			return
		}
		switch path.Ext(name) {
		case ".html":
			h.Set("Content-Type", "text/html; charset=utf-8")
		case ".js":
			h.Set("Content-Type", "text/javascript; charset=utf-8")
		case ".css":
			h.Set("Content-Type", "text/css; charset=utf-8")
		case ".svg":
			h.Set("Content-Type", "image/svg+xml")
		default:
			h.Set("Content-Type", "application/octet-stream")
		}
		w.Write(data)
	})
}
