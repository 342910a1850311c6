package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/lookup"
	"github.com/shardmq/shardmq/reconcile"
	"github.com/shardmq/shardmq/shard"
)

// Admin is what the operations endpoints need.
type Admin interface {
	// Topology describes the clusters, their endpoints with role, health,
	// breaker state and replica lag, and the shard map version.
	Topology(ctx context.Context) (any, error)
	// Reconcile runs the reconciliation job now.
	Reconcile(ctx context.Context, req reconcile.Request) (*reconcile.Report, error)
	// LastReconcile is the newest finished report, or nil.
	LastReconcile() *reconcile.Report
	// MissingTransactions says which transaction ids have no message.
	MissingTransactions(ctx context.Context, ids []string) (*lookup.MissingResult, error)
}

// maxTransactionIDs bounds one missing-transactions question.
const maxTransactionIDs = 10000

func (s *Server) topology(w http.ResponseWriter, r *http.Request) {
	top, err := s.admin.Topology(r.Context())
	if err != nil {
		writeError(w, s.hide(r, CodeInternal, err))
		return
	}
	writeJSON(w, http.StatusOK, top)
}

func (s *Server) lastReconcile(w http.ResponseWriter, r *http.Request) {
	rep := s.admin.LastReconcile()
	if rep == nil {
		writeError(w, fail(CodeNotFound, "no reconciliation has run on this router yet"))
		return
	}
	writeJSON(w, http.StatusOK, viewReport(rep))
}

func (s *Server) missingTransactions(w http.ResponseWriter, r *http.Request) {
	var req missingTransactionsRequest
	if e := s.decode(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	if e := s.validTransactionIDs(req.TransactionIDs, true); e != nil {
		writeError(w, e)
		return
	}
	res, err := s.admin.MissingTransactions(r.Context(), req.TransactionIDs)
	if err != nil {
		writeError(w, s.lookupError(r, err, "transactions"))
		return
	}
	writeJSON(w, http.StatusOK, viewMissing(w, res))
}

func (s *Server) validTransactionIDs(ids []string, required bool) *apiError {
	if required && len(ids) == 0 {
		return fail(CodeInvalidRequest, "transaction_ids must hold at least one id")
	}
	if len(ids) > maxTransactionIDs {
		return fail(CodeBatchTooLarge, fmt.Sprintf("at most %d transaction_ids, got %d", maxTransactionIDs, len(ids)))
	}
	for i, id := range ids {
		if id == "" || len(id) > s.limits.MaxKey || !utf8.ValidString(id) {
			return fail(CodeInvalidRequest, fmt.Sprintf("transaction_ids[%d] must be 1-%d bytes of UTF-8", i, s.limits.MaxKey))
		}
	}
	return nil
}

type missingTransactionsRequest struct {
	TransactionIDs []string `json:"transaction_ids"`
}

type reconcileRequest struct {
	Since          string   `json:"since"`
	Until          string   `json:"until"`
	Clusters       []string `json:"clusters"`
	VShards        []int    `json:"vshards"`
	DryRun         bool     `json:"dry_run"`
	Samples        int      `json:"samples"`
	TransactionIDs []string `json:"transaction_ids"`
}

func (s *Server) reconcile(w http.ResponseWriter, r *http.Request) {
	var body reconcileRequest
	if e := s.decodeOptional(w, r, &body); e != nil {
		writeError(w, e)
		return
	}
	req := reconcile.Request{Clusters: body.Clusters, DryRun: body.DryRun, Samples: body.Samples}
	for name, v := range map[string]string{"since": body.Since, "until": body.Until} {
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeError(w, fail(CodeInvalidRequest, name+" must be an RFC 3339 time: "+err.Error()))
			return
		}
		if name == "since" {
			req.Since = t
		} else {
			req.Until = t
		}
	}
	if !req.Since.IsZero() && !req.Until.IsZero() && !req.Since.Before(req.Until) {
		writeError(w, fail(CodeInvalidRequest, "since must be before until"))
		return
	}
	for i, v := range body.VShards {
		if v < 0 || v >= shard.Count {
			writeError(w, fail(CodeInvalidRequest, fmt.Sprintf("vshards[%d] is %d, want 0-%d", i, v, shard.Count-1)))
			return
		}
		req.VShards = append(req.VShards, shard.ID(v))
	}
	if body.Samples < 0 || body.Samples > 1000 {
		writeError(w, fail(CodeInvalidRequest, "samples must be 0-1000"))
		return
	}
	if e := s.validTransactionIDs(body.TransactionIDs, false); e != nil {
		writeError(w, e)
		return
	}
	rep, err := s.admin.Reconcile(r.Context(), req)
	if err != nil {
		if errors.Is(err, reconcile.ErrRunning) {
			writeError(w, fail(CodeUnavailable, reconcile.ErrRunning.Error()))
			return
		}
		writeError(w, s.lookupError(r, err, "reconciliation"))
		return
	}
	out := viewReport(rep)
	if len(body.TransactionIDs) > 0 {
		res, err := s.admin.MissingTransactions(r.Context(), body.TransactionIDs)
		if err != nil {
			writeError(w, s.lookupError(r, err, "transactions"))
			return
		}
		out["transactions"] = viewMissing(w, res)
	}
	if len(rep.Failed()) > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	writeJSON(w, http.StatusOK, out)
}

type findingView struct {
	Kind         string `json:"kind"`
	MessageID    string `json:"message_id"`
	VShard       int    `json:"vshard"`
	Topic        string `json:"topic"`
	Key          string `json:"key,omitempty"`
	Subscription string `json:"subscription,omitempty"`
	Have         string `json:"have,omitempty"`
	Want         string `json:"want,omitempty"`
	Repaired     bool   `json:"repaired"`
}

func viewReport(rep *reconcile.Report) map[string]any {
	clusters := make([]map[string]any, len(rep.Clusters))
	for i, c := range rep.Clusters {
		samples := make([]findingView, len(c.Samples))
		for j, f := range c.Samples {
			samples[j] = viewFinding(f)
		}
		clusters[i] = map[string]any{"cluster": c.Cluster, "read_from": c.ReadFrom, "endpoint": c.Endpoint, "scanned": c.Scanned,
			"found": c.Found, "repaired": c.Repaired, "samples": samples}
		if c.Error != "" {
			clusters[i]["error"] = c.Error
		}
	}
	failed := rep.Failed()
	if failed == nil {
		failed = []string{}
	}
	return map[string]any{"started_at": formatTime(rep.StartedAt), "finished_at": formatTime(rep.FinishedAt),
		"since": formatTime(rep.Since), "until": formatTime(rep.Until), "dry_run": rep.DryRun, "scanned": rep.Scanned,
		"found": rep.Found, "repaired": rep.Repaired, "clusters": clusters, "failed_clusters": failed,
		"missing_clusters": missingList(slices.Sorted(slices.Values(rep.Failed())))}
}

func viewFinding(f domain.Finding) findingView {
	return findingView{Kind: f.Kind, MessageID: strconv.FormatUint(f.MessageID, 10), VShard: int(f.VShard), Topic: f.Topic, Key: f.Key,
		Subscription: f.Subscription, Have: f.Have, Want: f.Want, Repaired: f.Repaired}
}

func viewMissing(w http.ResponseWriter, res *lookup.MissingResult) map[string]any {
	missing, unanswered := res.Missing, res.Unanswered
	if missing == nil {
		missing = []string{}
	}
	if unanswered == nil {
		unanswered = []lookup.ClusterError{}
	}
	if len(unanswered) > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	return map[string]any{"missing": missing, "found": res.Found, "complete": len(unanswered) == 0,
		"unanswered_clusters": unanswered, "missing_clusters": clusterNames(unanswered), "sources": res.Sources}
}

// clusterNames is missing_clusters of an answer whose parts failed on
// the clusters errs names: the names, sorted, [] when none.
func clusterNames(errs []lookup.ClusterError) []string {
	names := []string{}
	for _, e := range errs {
		names = append(names, e.Cluster)
	}
	sort.Strings(names)
	return names
}
