package lookup

import (
	"fmt"
	"testing"

	"github.com/shardmq/shardmq/store"
)

// A page merged from several sources never skips a message: a source with
// more after its page bounds the merge, and the cursor resumes there.
func TestMergePages(t *testing.T) {
	t.Parallel()
	found := func(ids ...uint64) []Found {
		var out []Found
		for _, id := range ids {
			out = append(out, Found{Message: &store.Message{ID: id, Topic: "t", PayloadJSON: true, Payload: make([]byte, 700)}})
		}
		return out
	}
	part := func(more bool, ids ...uint64) txPart {
		p := txPart{found: found(ids...), more: more}
		if len(ids) > 0 {
			p.last = ids[len(ids)-1]
		}
		return p
	}
	for _, c := range []struct {
		name       string
		parts      []txPart
		limit, max int
		want       string
		cursor     uint64
	}{
		{"all", []txPart{part(false, 1, 4), part(false, 2, 3)}, 10, 0, "[1 2 3 4]", 0},
		{"limit", []txPart{part(false, 1, 4), part(false, 2, 3)}, 3, 0, "[1 2 3]", 3},
		{"a source with more bounds the page", []txPart{part(true, 1, 2), part(false, 3, 4)}, 10, 0, "[1 2]", 2},
		{"bytes: the first always", []txPart{part(false, 1, 2)}, 10, 1, "[1]", 1},
		{"bytes: two of about 1000", []txPart{part(false, 1, 2, 3)}, 10, 2100, "[1 2]", 2},
		{"duplicate answered once", []txPart{part(false, 1, 2), part(false, 2, 3)}, 10, 0, "[1 2 3]", 0},
		{"a bound below every message found", []txPart{{more: true, last: 1}, part(false, 2)}, 10, 0, "[]", 1},
	} {
		got, cursor := mergePages(c.parts, c.limit, c.max)
		var ids []uint64
		for _, f := range got {
			ids = append(ids, f.ID)
		}
		if s := fmt.Sprint(ids); (s != c.want && !(c.want == "[]" && len(ids) == 0)) || cursor != c.cursor {
			t.Errorf("%s: %v cursor %d, want %s cursor %d", c.name, ids, cursor, c.want, c.cursor)
		}
	}
}
