package store

import (
	"bytes"
	"testing"
	"time"
)

// A row written to a cold file reads back the same: integers, times to the
// microsecond, NULLs, text that is not UTF-8, binary payloads.
func TestColdRowRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 3, 9, 10, 11, 12, 123456000, time.UTC)
	cases := []struct {
		table string
		row   MoveRow
	}{
		{TableArchiveMessages, MoveRow{uint64(1 << 60), at, int64(1023), []byte("orders"), []byte("k\xff\xfe"), nil, []byte("tx-1"),
			int64(9), []byte(`{"h":"v"}`), int64(0), []byte{0, 1, 2, 0xff}, int64(2), at, nil, nil, nil, nil, nil, emptyAckSlot}},
		{TableArchiveMessages, MoveRow{[]byte("42"), at, []byte("7"), "t", "ключ", "ok", nil, int64(0), nil, int64(1), []byte(`{}`), int64(1), at,
			[]byte("default"), []byte("w\xff"), int64(1), at, []byte("req-9"), append([]byte{1}, make([]byte, 63)...)}},
		{TableArchiveTrace, MoveRow{uint64(5), at, uint64(1 << 60), int64(3), []byte("default"), []byte("acked"), []byte("w1"), int64(2), at,
			nil, []byte("boom \x00"), []byte("req-1")}},
	}
	for i, c := range cases {
		line, err := EncodeRow(c.table, c.row)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		back, err := DecodeRow(c.table, line)
		if err != nil {
			t.Fatalf("case %d: %v (%s)", i, err, line)
		}
		kinds, _ := tierNamed(c.table)
		for j := range c.row {
			if want, got := canonical(kinds.kinds[j], c.row[j]), canonical(kinds.kinds[j], back[j]); want != got {
				t.Errorf("case %d column %d: wrote %q, read %q (%s)", i, j, want, got, line)
			}
		}
	}
	// A message row of a file written before the final ack's columns
	// reads them NULL, and the final ack's slot (migration 19) empty, its
	// default; a row lacking an older column is refused.
	old := []byte(`{"id":1,"created_at":"2024-03-09T10:11:12.123456Z","vshard":7,"topic":"t","msg_key":"k","order_key":null,"transaction_id":null,` +
		`"priority":0,"headers":null,"payload_json":1,"payload":"e30=","msg_status":1,"status_at":null}`)
	if r, err := DecodeRow(TableArchiveMessages, old); err != nil || len(r) != len(messageStoreMove.cols) || r[13] != nil || r[17] != nil || !bytes.Equal(r[18].([]byte), emptyAckSlot) {
		t.Errorf("a row of an older file: %v, %v", r, err)
	}
	if _, err := DecodeRow(TableArchiveMessages, []byte(`{"id":1}`)); err == nil {
		t.Error("a message row lacking columns was read")
	}
	if _, err := DecodeRow(TableArchiveTrace, []byte(`{"id":1}`)); err == nil {
		t.Error("a row lacking columns was read")
	}
}

// canonical is a value as the database would compare it.
func canonical(kind byte, v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case []byte:
		if kind == 'i' {
			return "n:" + string(x)
		}
		return "b:" + string(x)
	case string:
		return "b:" + x
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case int64, uint64:
		return "n:" + cursorText(x)
	}
	return "?"
}
