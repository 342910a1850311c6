package rebalance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/store"
)

// Job states, in the order a job goes through them. A job ends in done,
// aborted or failed.
const (
	StatePending    = "pending"     // recorded, not started
	StateCopying    = "copying"     // bulk copy of the vshards' rows
	StateCatchingUp = "catching_up" // re-sync of the rows changed since
	StateFreezing   = "freezing"    // frozen map written, waiting for every router
	StateFrozen     = "frozen"      // final sync and verification under freeze
	StateCutover    = "cutover"     // past the point of no return: flipping the map
	StateCleanup    = "cleanup"     // deleting the source rows
	StatePaused     = "paused"      // held by an operator (before the freeze)
	StateAborting   = "aborting"    // removing the target rows, unfreezing
	StateDone       = "done"
	StateAborted    = "aborted"
	StateFailed     = "failed"
)

// Terminal says whether a job in state s is finished.
func Terminal(s string) bool { return s == StateDone || s == StateAborted || s == StateFailed }

// Job is one resharding job as recorded in the state store. The fields
// with JSON names of the HTTP contract are its public view (View); the
// others are the runner's bookkeeping, recorded so that a new runner
// resumes where the last one stopped.
type Job struct {
	ID     string  `json:"job"`
	State  string  `json:"state"`
	Ranges []Range `json:"ranges"`
	// RowsTotal is the rows of the vshards on their sources: counted when
	// the job starts, raised when the copy finds rows produced since, and
	// set to the verified count under the freeze. RowsCopied is the rows
	// on the target: the bulk copy's, then the deliveries copied under
	// the freeze; never above RowsTotal, equal to it from the
	// verification on. RowsResynced counts the rows the catch-up and the
	// final sync wrote or deleted again because the source changed after
	// their copy (live traffic); it is not progress.
	RowsCopied   int64      `json:"rows_copied"`
	RowsTotal    int64      `json:"rows_total"`
	RowsResynced int64      `json:"rows_resynced"`
	MaxPauseMS   int64      `json:"max_pause_ms"`
	StartedAt    time.Time  `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at"`
	Error        string     `json:"error"`

	Moves []Move `json:"moves"`
	// Cursors is the copy's position per "source/target/table".
	Cursors map[string]store.MoveCursor `json:"cursors,omitempty"`
	// Resume is the state a paused job goes back to.
	Resume string `json:"resume,omitempty"`
	// AbortRequested is set by an operator; the runner acts on it.
	AbortRequested bool `json:"abort_requested,omitempty"`
	// FrozenAt is when the frozen map was written (the pause's start, an
	// upper bound).
	FrozenAt *time.Time `json:"frozen_at,omitempty"`
	// ReverseRequested: aborted after the flip; the job ends by
	// submitting ReversedBy, the move back.
	ReverseRequested bool   `json:"reverse_requested,omitempty"`
	ReversedBy       string `json:"reversed_by,omitempty"`
	// Verified is each table's row count of the vshards, equal on source
	// and target when the final sync verified them.
	Verified map[string]int64 `json:"verified,omitempty"`
	// FreezeAttempts counts freezes given up (the final sync did not
	// converge in the budget) and retried.
	FreezeAttempts int `json:"freeze_attempts,omitempty"`
	// FencedAt is the map version the sources' fences were raised to
	// (the frozen map); FlippedAt the version that gave the vshards to
	// their targets. Cleanup deletes a source's rows only while that
	// source's own record still gives them to the target at FlippedAt or
	// later.
	FencedAt  int64 `json:"fenced_at,omitempty"`
	FlippedAt int64 `json:"flipped_at,omitempty"`
}

// View is the job as the HTTP API shows it.
type View struct {
	Job          string     `json:"job"`
	State        string     `json:"state"`
	Ranges       []Range    `json:"ranges"`
	RowsCopied   int64      `json:"rows_copied"`
	RowsTotal    int64      `json:"rows_total"`
	RowsResynced int64      `json:"rows_resynced"`
	MaxPauseMS   int64      `json:"max_pause_ms"`
	StartedAt    time.Time  `json:"started_at"`
	FinishedAt   *time.Time `json:"finished_at"`
	Error        string     `json:"error"`
	// FencedAt and FlippedAt are the map versions the sources' fences were
	// raised to and that gave the vshards to their targets (0: not yet).
	FencedAt  int64 `json:"fenced_at,omitempty"`
	FlippedAt int64 `json:"flipped_at,omitempty"`
}

// View returns the public view of j.
func (j *Job) View() View {
	return View{Job: j.ID, State: j.State, Ranges: j.Ranges, RowsCopied: j.RowsCopied, RowsTotal: j.RowsTotal, RowsResynced: j.RowsResynced,
		MaxPauseMS: j.MaxPauseMS, StartedAt: j.StartedAt, FinishedAt: j.FinishedAt, Error: j.Error, FencedAt: j.FencedAt, FlippedAt: j.FlippedAt}
}

func (j *Job) clone() *Job {
	data, _ := json.Marshal(j)
	var c Job
	json.Unmarshal(data, &c)
	return &c
}

// vshards lists every vshard of the job.
func (j *Job) vshards() map[uint16]bool {
	out := map[uint16]bool{}
	for _, m := range j.Moves {
		for _, v := range m.VShards {
			out[v] = true
		}
	}
	return out
}

// Jobs is the state store's document: every job, with a version that
// grows on every write (the check-and-set token).
type Jobs struct {
	Version int64  `json:"version"`
	Jobs    []*Job `json:"jobs"`
	// LeaderEpoch is the epoch of the latest leader to run jobs: each new
	// leader takes the next one (rebalance/term.go).
	LeaderEpoch int64 `json:"leader_epoch,omitempty"`
}

// StateDoc is what the jobs need from the topology backend: one document
// where every router reads them, replaced only with check-and-set, so
// that the leader's progress and an operator's pause or abort through any
// router are never lost. The backends keep it opaque: a file beside the
// static topology (topology.FileBackend.ReshardState) or a Consul KV key
// (consul.Source.ReshardState).
type StateDoc interface {
	// Get returns the stored document (nil when none was written) and its
	// revision.
	Get(ctx context.Context) (data []byte, rev uint64, err error)
	// CompareAndSwap replaces the document read at revision rev (0: none
	// stored) by data; false, and nothing written, when it changed since.
	CompareAndSwap(ctx context.Context, rev uint64, data []byte) (bool, error)
}

// ErrConflict marks a state write refused because the document changed.
var ErrConflict = errors.New("reshard state changed concurrently")

// stateStore keeps the jobs in a StateDoc as JSON.
type stateStore struct {
	doc StateDoc
}

func (s stateStore) get(ctx context.Context) (*Jobs, uint64, error) {
	data, rev, err := s.doc.Get(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("read reshard state: %w", err)
	}
	if data == nil {
		return &Jobs{}, rev, nil
	}
	var js Jobs
	if err := json.Unmarshal(data, &js); err != nil {
		return nil, 0, fmt.Errorf("read reshard state: %w", err)
	}
	return &js, rev, nil
}

// Load returns the stored jobs (an empty document when none).
func (s stateStore) Load(ctx context.Context) (*Jobs, error) {
	js, _, err := s.get(ctx)
	return js, err
}

// Save replaces the document read at version prev by next, whose Version
// it sets to prev+1; ErrConflict when it changed.
func (s stateStore) Save(ctx context.Context, prev int64, next *Jobs) error {
	cur, rev, err := s.get(ctx)
	if err != nil {
		return err
	}
	if cur.Version != prev {
		return fmt.Errorf("%w: expected version %d, stored %d", ErrConflict, prev, cur.Version)
	}
	next.Version = prev + 1
	data, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("write reshard state: %w", err)
	}
	ok, err := s.doc.CompareAndSwap(ctx, rev, data)
	if err != nil {
		return fmt.Errorf("write reshard state: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: the document changed while it was written", ErrConflict)
	}
	return nil
}
