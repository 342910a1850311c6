package api

import (
	"fmt"
	"net/http"
	"strconv"
)

// The endpoints the operators' page acts with beyond the contract's
// (docs/design.md §7, docs/ui.md): who holds a subscription's leases, and
// deleting chosen dead letters.

// messageIDs parses message ids given as decimal strings.
func messageIDs(list []string) ([]uint64, *apiError) {
	ids := make([]uint64, len(list))
	for i, v := range list {
		id, err := strconv.ParseUint(v, 10, 64)
		if err != nil || id == 0 {
			return nil, fail(CodeInvalidRequest, fmt.Sprintf("ids[%d] %q is not a message id", i, v))
		}
		ids[i] = id
	}
	return ids, nil
}

type deleteDeadBody struct {
	IDs []string `json:"ids"`
}

// deleteDead deletes the dead letters with the given message ids:
// POST …/dead-letters/delete {"ids": […]} → {"deleted": N}. Ids that are
// not (or no longer) dead letters of the subscription are left alone and
// not counted.
func (s *Server) deleteDead(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	var body deleteDeadBody
	if e := s.decode(w, r, &body); e != nil {
		writeError(w, e)
		return
	}
	if len(body.IDs) == 0 {
		writeError(w, fail(CodeInvalidRequest, `"ids" must name at least one dead letter (DELETE …/dead-letters purges them all)`))
		return
	}
	if len(body.IDs) > s.limits.MaxBatch {
		writeError(w, fail(CodeBatchTooLarge, fmt.Sprintf("at most %d ids per delete", s.limits.MaxBatch)))
		return
	}
	ids, e := messageIDs(body.IDs)
	if e != nil {
		writeError(w, e)
		return
	}
	n, err := s.subs.DeleteDead(r.Context(), topic, name, ids)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"deleted": n})
}

type consumerJSON struct {
	Consumer      string `json:"consumer"`
	InFlight      int64  `json:"in_flight"`
	OldestLeaseAt string `json:"oldest_lease_at"`
}

// consumers answers who holds the subscription's leases now:
// {"consumers": [{"consumer", "in_flight", "oldest_lease_at"}]}, most in
// flight first, with missing_clusters naming those that did not answer.
func (s *Server) consumers(w http.ResponseWriter, r *http.Request) {
	topic, name, ok := topicAndSub(w, r)
	if !ok {
		return
	}
	list, missing, err := s.subs.Consumers(r.Context(), topic, name)
	if err != nil {
		s.subscriptionError(w, r, topic, name, err)
		return
	}
	out := make([]consumerJSON, len(list))
	for i, c := range list {
		out[i] = consumerJSON{Consumer: c.Consumer, InFlight: c.InFlight, OldestLeaseAt: formatTime(c.OldestLeaseAt)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"consumers": out, "missing_clusters": missingList(missing)})
}
