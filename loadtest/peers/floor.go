package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/shardmq/shardmq/loadtest"
)

// floorPhases runs loadtest.Floor, DESIGN §6's rows written by hand, in
// its own database beside the peer's, with the peer's phase shapes: the
// same publishers and batch, the same backlog; its single-message phase
// has the client scenario's senders. Its phases' target is "floor" for
// the queue layout (the product's) and "floor-" and the layout's name for
// the others ("floor-inline", "floor-onerow").
type floorPhases struct {
	db     *sql.DB
	f      *loadtest.Floor
	o      options
	cpu    []loadtest.CPUSource
	target string
	n      int
}

// newFloor creates database on the primary of dsn (dropped first when it
// exists) and the tables of the floor that floor makes on it.
func newFloor(ctx context.Context, dsn, database string, o options, cpu []loadtest.CPUSource, floor func(*sql.DB) *loadtest.Floor) (*floorPhases, error) {
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	for _, q := range []string{"DROP DATABASE IF EXISTS " + database, "CREATE DATABASE " + database} {
		if _, err := admin.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("floor database: %s: %w", q, err)
		}
	}
	db, err := sql.Open("mysql", dsn+database+"?interpolateParams=true&parseTime=true")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(128)
	db.SetMaxIdleConns(128)
	fl := &floorPhases{db: db, f: floor(db), o: o, cpu: cpu, target: "floor"}
	if fl.f.Layout != loadtest.LayoutQueue {
		fl.target = "floor-" + fl.f.Layout.String()
	}
	if err := fl.f.Create(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return fl, nil
}

func (fl *floorPhases) close() { fl.db.Close() }

func (fl *floorPhases) topic() string {
	fl.n++
	return fmt.Sprint("floor_", fl.n)
}

func (fl *floorPhases) phase(name, work string, r loadtest.FloorRun, tr *tracker) phase {
	return phase{Name: name, Target: fl.target, Work: work, Messages: r.Messages, Seconds: r.Window.Seconds(),
		PerSec: r.PerSec(), CPU: tr.finish(r.Total)}
}

func (fl *floorPhases) produceBatched(ctx context.Context, name string) (phase, error) {
	tr := newTracker(fl.cpu)
	r, err := fl.f.ProduceBatched(ctx, fl.topic(), fl.o.publishers, fl.o.batch, fl.o.duration, fl.o.warmup)
	if err != nil {
		return phase{}, err
	}
	return fl.phase(name, "produce", r, tr), nil
}

func (fl *floorPhases) produceSingle(ctx context.Context, name string) (phase, error) {
	tr := newTracker(fl.cpu)
	r, err := fl.f.ProduceSingle(ctx, fl.topic(), fl.o.floorClients, fl.o.floorCommitters, fl.o.duration, fl.o.warmup)
	if err != nil {
		return phase{}, err
	}
	return fl.phase(name, "single", r, tr), nil
}

func (fl *floorPhases) consume(ctx context.Context, name string) (phase, error) {
	topic := fl.topic()
	if err := fl.f.Preload(ctx, topic, fl.o.preload, fl.o.publishers, fl.o.batch); err != nil {
		return phase{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tr := newTracker(fl.cpu)
	r, err := fl.f.Consume(cctx, topic, fl.o.floorConsumers, fl.o.batch, int64(fl.o.preload))
	if err != nil {
		return phase{}, err
	}
	return fl.phase(name, "consume", r, tr), nil
}

// consumeOwned drains a backlog as the owner model does
// (loadtest.Floor.ConsumeOwned), acks flushed every 2 ms or 1,000.
func (fl *floorPhases) consumeOwned(ctx context.Context, name string) (phase, error) {
	topic := fl.topic()
	if err := fl.f.Preload(ctx, topic, fl.o.preload, fl.o.publishers, fl.o.batch); err != nil {
		return phase{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tr := newTracker(fl.cpu)
	r, err := fl.f.ConsumeOwned(cctx, topic, fl.o.floorConsumers, fl.o.batch, int64(fl.o.preload), 2*time.Millisecond, 1000)
	if err != nil {
		return phase{}, err
	}
	return fl.phase(name, "consume", r, tr), nil
}

// retire runs the one-row layout's retention (loadtest.Floor.Retire,
// 1,000 rows per transaction) over every row its phases left, with the
// servers settled before (the publish's replication out of its count)
// and after (the replicas' apply of the retire and a few seconds of
// InnoDB's purge of the deleted rows in its count).
func (fl *floorPhases) retire(ctx context.Context, name string, settle func(context.Context) error) (phase, error) {
	if err := settle(ctx); err != nil {
		return phase{}, err
	}
	tr := newTracker(fl.cpu)
	r, err := fl.f.Retire(ctx, 1000)
	if err != nil {
		return phase{}, err
	}
	if err := settle(ctx); err != nil {
		return phase{}, err
	}
	return fl.phase(name, "retire", r, tr), nil
}
