package retention

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/shardmq/shardmq/internal/ctxwait"
	"github.com/shardmq/shardmq/internal/idgen"
	"github.com/shardmq/shardmq/store"
)

// Cold files (docs/retention.md): one directory per month (YYYY-MM) under
// ColdDir, one gzip-compressed JSON-lines file per vshard range holding the
// month's archived messages and every archived trace event of them, and a
// manifest.json that lists each file with its row counts, the checksums
// the archive cluster computed for its rows (per table: the sum over
// vshards of SUM(CRC32(row))) and the SHA-256 of the file. A line is
// {"table":"archive_message"|"archive_trace","row":{column: value}}.

const (
	jobColdExport = "cold_export"
	jobRestored   = "restored"
	manifestName  = "manifest.json"
)

// Manifest describes one month's cold files.
type Manifest struct {
	Month   string         `json:"month"`
	Written time.Time      `json:"written_at"`
	Files   []ManifestFile `json:"files"`
}

// ManifestFile is one file of a month.
type ManifestFile struct {
	File        string `json:"file"` // relative to the cold directory
	VShardFrom  int    `json:"vshard_from"`
	VShardTo    int    `json:"vshard_to"`
	Messages    int64  `json:"messages"`
	Events      int64  `json:"events"`
	MessagesSum string `json:"messages_checksum"`
	EventsSum   string `json:"events_checksum"`
	SHA256      string `json:"sha256"`
	Bytes       int64  `json:"bytes"`
}

type coldLine struct {
	Table string          `json:"table"`
	Row   json.RawMessage `json:"row"`
}

// Cold exports the months past the warm window from the archive cluster to
// files and removes them from it.
func (j *Job) Cold(ctx context.Context) error {
	return j.pass(ctx, JobCold, func(ctx context.Context) error {
		arch := j.deps.Archive()
		if arch == nil {
			return nil
		}
		cutoff := store.MonthOf(j.cfg.Now()).AddDate(0, -j.cfg.WarmMonths, 0)
		months, err := j.warmMonths(ctx, arch, cutoff)
		if err != nil {
			return err
		}
		for _, m := range months {
			if _, _, err := arch.DoneAt(ctx, jobRestored, monthText(m)); err == nil {
				continue // restored by an operator: stays warm until released
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if err := j.exportMonth(ctx, arch, m); err != nil {
				return fmt.Errorf("month %s: %w", monthText(m), err)
			}
		}
		return nil
	})
}

// warmMonths lists the months from the oldest one the archive cluster
// holds rows of to the one before cutoff, oldest first (a month without
// rows exports nothing).
func (j *Job) warmMonths(ctx context.Context, arch *store.Store, cutoff time.Time) ([]time.Time, error) {
	var oldest time.Time
	for _, table := range []string{store.TableArchiveMessages, store.TableArchiveTrace} {
		rows, _, err := arch.TierRead(ctx, table, store.Span{To: cutoff, VFrom: 0, VTo: 1023, ByMessage: true}, 0, 1)
		if err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			continue
		}
		m, err := rowMonth(table, rows[0])
		if err != nil {
			return nil, err
		}
		if oldest.IsZero() || m.Before(oldest) {
			oldest = m
		}
	}
	var out []time.Time
	for m := oldest; !oldest.IsZero() && m.Before(cutoff); m = m.AddDate(0, 1, 0) {
		out = append(out, m)
	}
	return out, nil
}

// rowMonth is the month of the message a row belongs to.
func rowMonth(table string, r store.MoveRow) (time.Time, error) {
	if table == store.TableArchiveMessages {
		m, err := store.RowMessage(r)
		if err != nil {
			return time.Time{}, err
		}
		return store.MonthOf(m.CreatedAt), nil
	}
	id, err := store.RowMessageID(r)
	if err != nil {
		return time.Time{}, err
	}
	return store.MonthOf(idgen.Time(id)), nil
}

// exportMonth writes month m's files range by range, indexes their
// messages, updates the manifest and removes the rows from the archive
// cluster. A range recorded as exported is not written again; its rows
// are removed (again) in case the pass stopped before.
func (j *Job) exportMonth(ctx context.Context, arch *store.Store, m time.Time) error {
	dir := filepath.Join(j.cfg.ColdDir, monthText(m))
	man, err := readManifest(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if man == nil {
		man = &Manifest{Month: monthText(m)}
	}
	for _, r := range j.cfg.ranges() {
		sp := store.Span{From: m, To: m.AddDate(0, 1, 0), VFrom: r[0], VTo: r[1], ByMessage: true}
		item := fmt.Sprintf("%s/v%04d-%04d", monthText(m), r[0], r[1])
		_, _, err := arch.DoneAt(ctx, jobColdExport, item)
		switch {
		case errors.Is(err, store.ErrNotFound):
			f, err := j.exportRange(ctx, arch, sp)
			if err != nil {
				return err
			}
			if f != nil {
				man.put(*f)
				man.Written = j.cfg.Now().UTC()
				if err := writeManifest(dir, man); err != nil {
					return err
				}
				j.addItem(JobCold, "file_written")
			}
			if err := arch.MarkDone(ctx, jobColdExport, item, "", j.cfg.Now()); err != nil {
				return err
			}
		case err != nil:
			return err
		}
		for _, table := range []string{store.TableArchiveMessages, store.TableArchiveTrace} {
			if _, err := arch.TierDelete(ctx, table, sp, j.cfg.BatchRows, j.cfg.Pause); err != nil {
				return err
			}
		}
	}
	j.cfg.Log.Info("month exported to cold files and removed from the archive cluster", "month", monthText(m), "dir", dir)
	return nil
}

func (man *Manifest) put(f ManifestFile) {
	for i := range man.Files {
		if man.Files[i].File == f.File {
			man.Files[i] = f
			return
		}
	}
	man.Files = append(man.Files, f)
	sort.Slice(man.Files, func(a, b int) bool { return man.Files[a].VShardFrom < man.Files[b].VShardFrom })
}

// exportRange writes one span's rows to its file, reads the file back to
// check it, and indexes its messages. Nil when the span holds no row.
func (j *Job) exportRange(ctx context.Context, arch *store.Store, sp store.Span) (*ManifestFile, error) {
	msgSums, err := arch.TierSums(ctx, store.TableArchiveMessages, sp)
	if err != nil {
		return nil, err
	}
	evSums, err := arch.TierSums(ctx, store.TableArchiveTrace, sp)
	if err != nil {
		return nil, err
	}
	if len(msgSums) == 0 && len(evSums) == 0 {
		return nil, nil
	}
	f := &ManifestFile{File: filepath.Join(monthText(sp.From), fmt.Sprintf("v%04d-%04d.jsonl.gz", sp.VFrom, sp.VTo)),
		VShardFrom: int(sp.VFrom), VShardTo: int(sp.VTo)}
	f.Messages, f.MessagesSum = total(msgSums)
	f.Events, f.EventsSum = total(evSums)
	path := filepath.Join(j.cfg.ColdDir, f.File)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("cold file: %w", err)
	}
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return nil, fmt.Errorf("cold file: %w", err)
	}
	defer os.Remove(tmp)
	h := sha256.New()
	counter := &countingWriter{w: io.MultiWriter(out, h)}
	zw := gzip.NewWriter(counter)
	bw := bufio.NewWriter(zw)
	now := j.cfg.Now()
	var rows [2]int64
	for i, table := range []string{store.TableArchiveMessages, store.TableArchiveTrace} {
		var after uint64
		for {
			batch, last, err := arch.TierRead(ctx, table, sp, after, j.cfg.BatchRows)
			if err != nil {
				out.Close()
				return nil, err
			}
			if len(batch) == 0 {
				break
			}
			for _, r := range batch {
				enc, err := store.EncodeRow(table, r)
				if err != nil {
					out.Close()
					return nil, err
				}
				line, _ := json.Marshal(coldLine{Table: table, Row: enc})
				bw.Write(line)
				bw.WriteByte('\n')
			}
			if table == store.TableArchiveMessages {
				if err := arch.IndexCold(ctx, batch, f.File, now); err != nil {
					out.Close()
					return nil, err
				}
			}
			rows[i] += int64(len(batch))
			after = last
			if err := ctxwait.Sleep(ctx, j.cfg.Pause); err != nil {
				out.Close()
				return nil, err
			}
		}
	}
	err = errors.Join(bw.Flush(), zw.Close())
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("cold file %s: %w", f.File, err)
	}
	if rows[0] != f.Messages || rows[1] != f.Events {
		return nil, fmt.Errorf("cold file %s: read %d messages and %d events, the checksum query counted %d and %d (rows changed while exported)",
			f.File, rows[0], rows[1], f.Messages, f.Events)
	}
	f.SHA256, f.Bytes = hex.EncodeToString(h.Sum(nil)), counter.n
	// Read it back: the file must open, hash and decode to the same rows.
	got, err := readColdFile(tmp, f.SHA256, nil)
	if err != nil {
		return nil, err
	}
	if got[0] != f.Messages || got[1] != f.Events {
		return nil, fmt.Errorf("cold file %s: read back %d messages and %d events, wrote %d and %d", f.File, got[0], got[1], f.Messages, f.Events)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("cold file: %w", err)
	}
	j.addRows(JobCold, rows[0]+rows[1])
	return f, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// total adds per-vshard counts and checksums.
func total(sums map[uint16]store.MoveBucket) (int64, string) {
	var rows int64
	sum := new(big.Int)
	for _, b := range sums {
		rows += b.Rows
		x, ok := new(big.Int).SetString(b.Sum, 10)
		if ok {
			sum.Add(sum, x)
		}
	}
	return rows, sum.String()
}

// readColdFile checks a file's SHA-256 and decodes every line, handing
// rows to each (when not nil); it returns the rows read per table.
func readColdFile(path, sha string, each func(table string, r store.MoveRow) error) ([2]int64, error) {
	var n [2]int64
	in, err := os.Open(path)
	if err != nil {
		return n, fmt.Errorf("cold file: %w", err)
	}
	defer in.Close()
	h := sha256.New()
	zr, err := gzip.NewReader(io.TeeReader(in, h))
	if err != nil {
		return n, fmt.Errorf("cold file %s: %w", path, err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var l coldLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return n, fmt.Errorf("cold file %s: line %d: %w", path, n[0]+n[1]+1, err)
		}
		r, err := store.DecodeRow(l.Table, l.Row)
		if err != nil {
			return n, fmt.Errorf("cold file %s: line %d: %w", path, n[0]+n[1]+1, err)
		}
		i := 0
		if l.Table == store.TableArchiveTrace {
			i = 1
		}
		n[i]++
		if each != nil {
			if err := each(l.Table, r); err != nil {
				return n, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return n, fmt.Errorf("cold file %s: %w", path, err)
	}
	if _, err := io.Copy(h, in); err != nil { // bytes past the gzip stream, if any, count too
		return n, fmt.Errorf("cold file %s: %w", path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha {
		return n, fmt.Errorf("cold file %s: SHA-256 %s, the manifest says %s", path, got, sha)
	}
	return n, nil
}

func readManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", dir, err)
	}
	return &m, nil
}

func writeManifest(dir string, m *Manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, manifestName+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, manifestName)); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	return nil
}

// ErrNoArchive: the topology names no archive cluster, or it cannot be
// reached.
var ErrNoArchive = errors.New("no archive cluster: the topology names none, or it cannot be reached")

// ErrNotRestored: Release of a month that is not restored (never, or
// released already).
var ErrNotRestored = errors.New("month is not restored")

// RestoreReport says what a restore put back.
type RestoreReport struct {
	Month    string `json:"month"`
	Files    int    `json:"files"`
	Messages int64  `json:"messages"`
	Events   int64  `json:"events"`
}

// Restore puts month's cold files back into the archive cluster: each
// file's SHA-256 is checked, its rows upserted, and the archive cluster's
// counts and checksums of its span compared with the manifest's. The
// month is then pinned warm (the cold job leaves it) until Release.
func (j *Job) Restore(ctx context.Context, month time.Time) (*RestoreReport, error) {
	if !j.deps.Leading() {
		return nil, ErrNotLeading
	}
	j.run.Lock()
	defer j.run.Unlock()
	arch := j.deps.Archive()
	if arch == nil {
		return nil, ErrNoArchive
	}
	m := store.MonthOf(month)
	man, err := readManifest(filepath.Join(j.cfg.ColdDir, monthText(m)))
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", monthText(m), err)
	}
	rep := &RestoreReport{Month: monthText(m)}
	for _, f := range man.Files {
		var batch [2][]store.MoveRow
		tables := [2]string{store.TableArchiveMessages, store.TableArchiveTrace}
		flush := func(i int) error {
			if len(batch[i]) == 0 {
				return nil
			}
			if err := arch.TierWrite(ctx, tables[i], batch[i]); err != nil {
				return err
			}
			j.addRows("restore", int64(len(batch[i])))
			batch[i] = batch[i][:0]
			return ctxwait.Sleep(ctx, j.cfg.Pause)
		}
		n, err := readColdFile(filepath.Join(j.cfg.ColdDir, f.File), f.SHA256, func(table string, r store.MoveRow) error {
			i := 0
			if table == store.TableArchiveTrace {
				i = 1
			}
			batch[i] = append(batch[i], r)
			if len(batch[i]) >= j.cfg.BatchRows {
				return flush(i)
			}
			return nil
		})
		if err == nil {
			err = errors.Join(flush(0), flush(1))
		}
		if err != nil {
			return rep, fmt.Errorf("restore %s: %w", f.File, err)
		}
		sp := store.Span{From: m, To: m.AddDate(0, 1, 0), VFrom: uint16(f.VShardFrom), VTo: uint16(f.VShardTo), ByMessage: true}
		msgs, err := arch.TierSums(ctx, store.TableArchiveMessages, sp)
		if err != nil {
			return rep, err
		}
		evs, err := arch.TierSums(ctx, store.TableArchiveTrace, sp)
		if err != nil {
			return rep, err
		}
		mc, ms := total(msgs)
		ec, es := total(evs)
		if mc != f.Messages || ms != f.MessagesSum || ec != f.Events || es != f.EventsSum {
			return rep, fmt.Errorf("restore %s: the archive cluster holds %d messages (checksum %s) and %d events (%s), the manifest says %d (%s) and %d (%s)",
				f.File, mc, ms, ec, es, f.Messages, f.MessagesSum, f.Events, f.EventsSum)
		}
		rep.Files++
		rep.Messages += n[0]
		rep.Events += n[1]
	}
	if err := arch.MarkDone(ctx, jobRestored, monthText(m), fmt.Sprintf("files=%d messages=%d events=%d", rep.Files, rep.Messages, rep.Events), j.cfg.Now()); err != nil {
		return rep, err
	}
	j.addItem(JobCold, "month_restored")
	j.cfg.Log.Info("month restored from cold files to the archive cluster", "month", rep.Month, "files", rep.Files, "messages", rep.Messages, "events", rep.Events)
	return rep, nil
}

// Release unpins a restored month: the next cold pass exports it again
// (to the same files) and removes it from the archive cluster. A month
// that was never restored (or was released already) is ErrNotRestored:
// there is nothing to release, and saying "released" would be a lie.
func (j *Job) Release(ctx context.Context, month time.Time) error {
	if !j.deps.Leading() {
		return ErrNotLeading
	}
	j.run.Lock()
	defer j.run.Unlock()
	arch := j.deps.Archive()
	if arch == nil {
		return ErrNoArchive
	}
	m := monthText(store.MonthOf(month))
	if _, _, err := arch.DoneAt(ctx, jobRestored, m); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotRestored, m)
	} else if err != nil {
		return err
	}
	if err := arch.ForgetDone(ctx, jobRestored, m); err != nil {
		return err
	}
	return arch.ForgetDone(ctx, jobColdExport, m+"/")
}
