package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/shardmq/shardmq/rebalance"
)

// Resharder is what the resharding endpoints need (DESIGN §5, §7).
type Resharder interface {
	Submit(ctx context.Context, ranges []rebalance.Range, dryRun bool) (*rebalance.Job, []rebalance.Move, error)
	Get(ctx context.Context, id string) (*rebalance.Job, error)
	List(ctx context.Context) ([]*rebalance.Job, error)
	Pause(ctx context.Context, id string) (*rebalance.Job, error)
	Resume(ctx context.Context, id string) (*rebalance.Job, error)
	Abort(ctx context.Context, id string) (*rebalance.Job, error)
	PlanRanges(ctx context.Context, addCluster, drain string) ([]rebalance.Range, error)
}

var _ Resharder = (*rebalance.Manager)(nil)

type reshardRequest struct {
	Ranges []rebalance.Range `json:"ranges"`
	DryRun bool              `json:"dry_run"`
	// AddCluster or Drain ask the planner for the ranges instead.
	AddCluster string `json:"add_cluster"`
	Drain      string `json:"drain"`
}

// RouteReshard registers the resharding endpoints.
func (s *Server) RouteReshard(rs Resharder) {
	s.resharder = rs
	s.register(byRouteReshard)
}

func (s *Server) submitReshard(w http.ResponseWriter, r *http.Request) {
	var req reshardRequest
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if req.AddCluster != "" || req.Drain != "" {
		if len(req.Ranges) > 0 {
			writeError(w, fail(CodeInvalidRequest, "give ranges, add_cluster or drain, not several"))
			return
		}
		planned, err := s.resharder.PlanRanges(r.Context(), req.AddCluster, req.Drain)
		if err != nil {
			writeError(w, reshardError(err))
			return
		}
		req.Ranges = planned
	}
	job, moves, err := s.resharder.Submit(r.Context(), req.Ranges, req.DryRun)
	if err != nil {
		writeError(w, reshardError(err))
		return
	}
	if req.DryRun {
		writeJSON(w, http.StatusOK, map[string]any{"dry_run": true, "ranges": req.Ranges, "moves": moves})
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"job": job.ID, "state": job.State})
}

func (s *Server) listReshards(w http.ResponseWriter, r *http.Request) {
	jobs, err := s.resharder.List(r.Context())
	if err != nil {
		writeError(w, reshardError(err))
		return
	}
	views := make([]rebalance.View, len(jobs))
	for i, j := range jobs {
		views[i] = j.View()
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": views})
}

func (s *Server) getReshard(w http.ResponseWriter, r *http.Request) {
	s.reshardJob(w, r, s.resharder.Get)
}

func (s *Server) pauseReshard(w http.ResponseWriter, r *http.Request) {
	s.reshardJob(w, r, s.resharder.Pause)
}

func (s *Server) resumeReshard(w http.ResponseWriter, r *http.Request) {
	s.reshardJob(w, r, s.resharder.Resume)
}

func (s *Server) abortReshard(w http.ResponseWriter, r *http.Request) {
	s.reshardJob(w, r, s.resharder.Abort)
}

// reshardJob answers with the view of the job of the path after op.
func (s *Server) reshardJob(w http.ResponseWriter, r *http.Request, op func(context.Context, string) (*rebalance.Job, error)) {
	job, err := op(r.Context(), r.PathValue("job"))
	if err != nil {
		writeError(w, reshardError(err))
		return
	}
	writeJSON(w, http.StatusOK, job.View())
}

func reshardError(err error) *apiError {
	switch {
	case errors.Is(err, rebalance.ErrInvalid):
		return fail(CodeInvalidRequest, err.Error())
	case errors.Is(err, rebalance.ErrBusy):
		return fail(CodeReshardConflict, err.Error())
	case errors.Is(err, rebalance.ErrState):
		return fail(CodeReshardState, err.Error())
	case errors.Is(err, rebalance.ErrNotFound):
		return fail(CodeNotFound, err.Error())
	}
	return fail(CodeInternal, err.Error())
}
