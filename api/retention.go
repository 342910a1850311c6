package api

import (
	"context"
	"errors"
	"net/http"
	"os"

	"github.com/shardmq/shardmq/retention"
)

// Retention is what the retention endpoints need (docs/retention.md).
type Retention interface {
	Status() retention.Status
	// RunNow runs a pass of every retention job on this router.
	RunNow(ctx context.Context) error
	// Restore puts a month's cold files back into the archive cluster;
	// Release lets the cold job export it again.
	Restore(ctx context.Context, month string) (*retention.RestoreReport, error)
	Release(ctx context.Context, month string) error
}

// RouteRetention registers the retention endpoints and adds retention's
// status to GET /v1/admin/stats.
func (s *Server) RouteRetention(rt Retention) {
	s.retention = rt
	s.register(byRouteRetention)
}

func (s *Server) retentionStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.retention.Status())
}

func (s *Server) runRetention(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	err := s.retention.RunNow(r.Context())
	if errors.Is(err, retention.ErrNotLeading) {
		writeError(w, fail(CodeUnavailable, err.Error()))
		return
	}
	out := map[string]any{"status": s.retention.Status()}
	if err != nil {
		s.log.Warn("retention pass asked by an operator failed", "err", err)
		out["error"] = err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

// month reads the body {"month": "YYYY-MM"} of restore and release.
func (s *Server) month(w http.ResponseWriter, r *http.Request) (string, bool) {
	var req struct {
		Month string `json:"month"`
	}
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return "", false
	}
	if _, err := retention.ParseMonth(req.Month); err != nil {
		writeError(w, fail(CodeInvalidRequest, err.Error()))
		return "", false
	}
	return req.Month, true
}

func (s *Server) restoreMonth(w http.ResponseWriter, r *http.Request) {
	m, ok := s.month(w, r)
	if !ok {
		return
	}
	rep, err := s.retention.Restore(r.Context(), m)
	switch {
	case errors.Is(err, retention.ErrNoArchive), errors.Is(err, retention.ErrNotLeading):
		writeError(w, fail(CodeUnavailable, err.Error()))
	case errors.Is(err, os.ErrNotExist):
		writeError(w, fail(CodeNotFound, "no cold files of month "+m))
	case err != nil:
		writeError(w, s.hide(r, CodeInternal, err))
	default:
		writeJSON(w, http.StatusOK, rep)
	}
}

func (s *Server) releaseMonth(w http.ResponseWriter, r *http.Request) {
	m, ok := s.month(w, r)
	if !ok {
		return
	}
	if err := s.retention.Release(r.Context(), m); err != nil {
		if errors.Is(err, retention.ErrNoArchive) || errors.Is(err, retention.ErrNotLeading) {
			writeError(w, fail(CodeUnavailable, err.Error()))
			return
		}
		if errors.Is(err, retention.ErrNotRestored) {
			writeError(w, fail(CodeNotFound, "month "+m+" is not restored: nothing to release"))
			return
		}
		writeError(w, s.hide(r, CodeInternal, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"month": m, "released": true})
}
