package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Month partitions of message_store and message_trace (DESIGN §2, §8):
// RANGE COLUMNS on created_at, one partition pYYYYMM per month holding
// rows created before the first of the next month, and pmax (MAXVALUE)
// above them. The partition upkeep splits pmax ahead of time so that
// every month has its partition before its first row; a row of a month
// past the last one is never refused, it waits in pmax until the split
// moves it to its month.

// Partition is one partition of a table as information_schema shows it.
type Partition struct {
	Name string
	// LessThan is the partition's upper bound; zero for pmax (MAXVALUE).
	LessThan time.Time
	// Rows is the engine's estimate; DataLength, IndexLength and DataFree
	// are bytes (DataFree: allocated but unused).
	Rows, DataLength, IndexLength, DataFree int64
}

// Month is the month a pYYYYMM partition holds (its bound minus a month).
func (p Partition) Month() time.Time {
	if p.LessThan.IsZero() {
		return time.Time{}
	}
	return p.LessThan.AddDate(0, -1, 0)
}

// FreeRatio is the share of the partition's space that is allocated but
// unused (what a rebuild gives back).
func (p Partition) FreeRatio() float64 {
	total := p.DataLength + p.IndexLength + p.DataFree
	if total == 0 {
		return 0
	}
	return float64(p.DataFree) / float64(total)
}

// PartitionedTables are the tables partitioned by month.
var PartitionedTables = []string{TableMessages, TableTrace}

func checkPartitioned(table string) error {
	for _, t := range PartitionedTables {
		if t == table {
			return nil
		}
	}
	return fmt.Errorf("%s is not partitioned by month", table)
}

// PartitionName is the name of month's partition (pYYYYMM).
func PartitionName(month time.Time) string { return "p" + month.UTC().Format("200601") }

// MonthOf is the first instant of t's month, UTC.
func MonthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// Partitions lists table's partitions in order, pmax last. MariaDB
// answers information_schema through an internal temporary table, whose
// file handling has been seen to fail once under load (error 6 on its
// delete): the read is tried up to three times.
func (s *Store) Partitions(ctx context.Context, table string) ([]Partition, error) {
	if err := checkPartitioned(table); err != nil {
		return nil, err
	}
	var err error
	for i := 0; i < 3; i++ {
		var out []Partition
		if out, err = s.partitions(ctx, table); err == nil || ctx.Err() != nil {
			return out, err
		}
	}
	return nil, err
}

func (s *Store) partitions(ctx context.Context, table string) ([]Partition, error) {
	type row struct {
		p    Partition
		desc string // the bound as the server writes it
	}
	rows, err := queryRows(ctx, s.db, "list partitions of "+table, `SELECT PARTITION_NAME, PARTITION_DESCRIPTION, COALESCE(TABLE_ROWS, 0), COALESCE(DATA_LENGTH, 0),
  COALESCE(INDEX_LENGTH, 0), COALESCE(DATA_FREE, 0) FROM information_schema.PARTITIONS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL ORDER BY PARTITION_ORDINAL_POSITION`, []any{table}, func(rows *sql.Rows) (r row, err error) {
		err = rows.Scan(&r.p.Name, &r.desc, &r.p.Rows, &r.p.DataLength, &r.p.IndexLength, &r.p.DataFree)
		return r, err
	})
	if err != nil {
		return nil, translate(err)
	}
	out := make([]Partition, len(rows))
	for i, r := range rows {
		out[i] = r.p
		if strings.EqualFold(r.desc, "MAXVALUE") {
			continue
		}
		d := strings.Trim(r.desc, "'")
		t, err := time.Parse(time.DateTime, d)
		if err != nil {
			if t, err = time.Parse(time.DateOnly, d); err != nil {
				return nil, fmt.Errorf("partition %s of %s: bound %q: %w", r.p.Name, table, r.desc, err)
			}
		}
		out[i].LessThan = t.UTC()
	}
	return out, nil
}

// SplitMax gives each of months (first instants, ascending, all after
// the last month partition) its partition, splitting pmax in one
// statement; rows of those months already in pmax move to their month.
func (s *Store) SplitMax(ctx context.Context, table string, months []time.Time) error {
	if err := checkPartitioned(table); err != nil {
		return err
	}
	if len(months) == 0 {
		return nil
	}
	parts := make([]string, 0, len(months)+1)
	for _, m := range months {
		parts = append(parts, fmt.Sprintf("PARTITION %s VALUES LESS THAN ('%s')", PartitionName(m), MonthOf(m).AddDate(0, 1, 0).Format(time.DateOnly)))
	}
	parts = append(parts, "PARTITION pmax VALUES LESS THAN (MAXVALUE)")
	q := "ALTER TABLE " + table + " REORGANIZE PARTITION pmax INTO (" + strings.Join(parts, ", ") + ")"
	if _, err := s.db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("split pmax of %s: %w", table, translate(err))
	}
	return nil
}

// DropPartition drops one month partition of table, with its rows.
func (s *Store) DropPartition(ctx context.Context, table, name string) error {
	if err := checkPartitioned(table); err != nil {
		return err
	}
	if name == "pmax" || !validPartitionName(name) {
		return fmt.Errorf("drop partition %s of %s: not a month partition", name, table)
	}
	if _, err := s.db.ExecContext(ctx, "ALTER TABLE "+table+" DROP PARTITION "+name); err != nil {
		return fmt.Errorf("drop partition %s of %s: %w", name, table, translate(err))
	}
	return nil
}

func validPartitionName(name string) bool {
	if len(name) != 7 || name[0] != 'p' {
		return false
	}
	for _, c := range name[1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// CountPartition counts the rows in one partition of table, exactly.
func (s *Store) CountPartition(ctx context.Context, table, name string) (int64, error) {
	if err := checkPartitioned(table); err != nil {
		return 0, err
	}
	if name != "pmax" && !validPartitionName(name) {
		return 0, fmt.Errorf("count partition %s of %s: not a partition name", name, table)
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" PARTITION ("+name+")").Scan(&n); err != nil {
		return 0, fmt.Errorf("count partition %s of %s: %w", name, table, translate(err))
	}
	return n, nil
}

// Analyze refreshes table's index statistics (ANALYZE TABLE).
func (s *Store) Analyze(ctx context.Context, table string) error {
	if err := checkPartitioned(table); err != nil {
		return err
	}
	return s.adminStatement(ctx, "ANALYZE TABLE "+table)
}

// RebuildPartition rebuilds one partition of table, giving its free space
// back (ALTER TABLE … REBUILD PARTITION, then ANALYZE PARTITION: on
// InnoDB, OPTIMIZE PARTITION would rebuild the whole table).
func (s *Store) RebuildPartition(ctx context.Context, table, name string) error {
	if err := checkPartitioned(table); err != nil {
		return err
	}
	if name != "pmax" && !validPartitionName(name) {
		return fmt.Errorf("rebuild partition %s of %s: not a partition name", name, table)
	}
	if _, err := s.db.ExecContext(ctx, "ALTER TABLE "+table+" REBUILD PARTITION "+name); err != nil {
		return fmt.Errorf("rebuild partition %s of %s: %w", name, table, translate(err))
	}
	return s.adminStatement(ctx, "ALTER TABLE "+table+" ANALYZE PARTITION "+name)
}

// adminStatement runs ANALYZE-like statements, which answer a result set
// whose Msg_type says whether they failed.
func (s *Store) adminStatement(ctx context.Context, q string) error {
	var failed string // the server's own word that it failed: not an outage
	err := queryEach(ctx, s.db, q, q, nil, func(rows *sql.Rows) error {
		var tbl, op, typ, text string
		err := rows.Scan(&tbl, &op, &typ, &text)
		if err == nil && failed == "" && strings.EqualFold(typ, "error") {
			failed = text
		}
		return err
	})
	if err != nil {
		return translate(err)
	}
	if failed != "" {
		return fmt.Errorf("%s: %s", q, failed)
	}
	return nil
}
