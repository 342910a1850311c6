package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// routerAnswer is a claim's answer as the router writes it (api's
// appendClaimed): every field, in its order.
func routerAnswer(n int) string {
	var b strings.Builder
	b.WriteString(`{"messages":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"%d","key":"lt-r-k%d","topic":"lt1-r-0","vshard":%d,"payload":{"k":"lt-r-k%d","pad":"xxxx"},`+
			`"headers":{},"priority":0,"order_key":"","transaction_id":"","produced_at":"2026-12-02T16:02:27.951Z",`+
			`"attempt":%d,"receipt":"v1.abc%d","lease_expires_at":"2026-12-02T16:02:37.951Z"}`, 7400000000000000000+i, i, i%1024, i, 1+i%3, i)
	}
	b.WriteString("]}\n")
	return b.String()
}

// sameDeliveries says whether two decodes agree on every field.
func sameDeliveries(a, b []Delivery) error {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return fmt.Errorf("%d deliveries (nil %v) against %d (nil %v)", len(a), a == nil, len(b), b == nil)
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Key != y.Key || x.ID != y.ID || x.VShard != y.VShard || x.Attempt != y.Attempt || !x.ProducedAt.Equal(y.ProducedAt) ||
			!bytes.Equal(x.Payload, y.Payload) || (x.Payload == nil) != (y.Payload == nil) || x.Receipt != y.Receipt {
			return fmt.Errorf("delivery %d: %+v against %+v", i, x, y)
		}
	}
	return nil
}

func byEncodingJSON(data []byte) ([]Delivery, error) {
	var c claimJSON
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	return c.deliveries(), nil
}

// decodeClaim answers as encoding/json whenever it answers at all, and it
// answers for the router's own answers.
func TestDecodeClaimAsEncodingJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		fast bool // decodeClaim must take it
	}{
		{"router answer", routerAnswer(3), true},
		{"empty", `{"messages":[]}`, true},
		{"null messages", `{"messages":null}`, true},
		{"no messages", `{}`, true},
		{"other members", ` { "next" : [1, -2.5e3, true, false, null, {"a":"\u00e9\n"}], "messages" : [ {"id":"7"} ] } `, true},
		{"payload kinds", `{"messages":[{"payload":"a\"b"},{"payload":[1,{"x":null}]},{"payload":null},{"payload":-0.5E+2}]}`, true},
		{"base64 payload", `{"messages":[{"id":"1","payload_base64":"AAEC"}]}`, true},
		{"null fields", `{"messages":[{"id":null,"key":null,"produced_at":null,"attempt":null,"receipt":null,"vshard":null}]}`, true},
		{"null element", `{"messages":[null,{"id":"2"}]}`, true},
		{"repeated field", `{"messages":[{"key":"a","key":"b","attempt":1,"attempt":2}]}`, true},
		{"offset time", `{"messages":[{"produced_at":"2026-12-02T16:02:27.951+01:00"}]}`, true},
		{"error code", `{"messages":[{"id":"3","error_code":"poison"}]}`, true},

		{"escaped key", `{"messages":[{"key":"a\u0062"}]}`, false},
		{"escaped name", `{"messages":[{"\u0069d":"9"}]}`, false},
		{"name in another case", `{"messages":[{"ID":"9"}]}`, false},
		{"messages in another case", `{"Messages":[{"id":"9"}]}`, false},
		{"messages twice", `{"messages":[{"id":"1","key":"a"}],"messages":[{"id":"2"}]}`, false},
		{"invalid utf-8 key", "{\"messages\":[{\"key\":\"\xff\"}]}", false},
		{"fractional attempt", `{"messages":[{"attempt":1.5}]}`, false},
		{"numeric id", `{"messages":[{"id":9}]}`, false},
		{"bad time", `{"messages":[{"produced_at":"yesterday"}]}`, false},
		{"trailing garbage", `{"messages":[]} x`, false},
		{"truncated", routerAnswer(2)[:300], false},
		{"leading zero", `{"messages":[{"attempt":01}]}`, false},
		{"bad escape", `{"messages":[{"topic":"\x"}]}`, false},
		{"not an object", `[]`, false},
		{"null answer", `null`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, ok := decodeClaim([]byte(tc.in))
			if ok != tc.fast {
				t.Fatalf("decodeClaim took it: %v, want %v", ok, tc.fast)
			}
			want, werr := byEncodingJSON([]byte(tc.in))
			if ok {
				if werr != nil {
					t.Fatalf("decodeClaim took what encoding/json refuses: %v", werr)
				}
				if err := sameDeliveries(fast, want); err != nil {
					t.Fatal(err)
				}
			}
			var a claimAnswer
			err := a.decodeJSON([]byte(tc.in))
			if (err == nil) != (werr == nil) {
				t.Fatalf("claimAnswer error %v, encoding/json's %v", err, werr)
			}
			if err == nil {
				if err := sameDeliveries(a.deliveries, want); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	ds, ok := decodeClaim([]byte(routerAnswer(2)))
	if !ok || len(ds) != 2 || ds[1].ID != 7400000000000000001 || ds[1].Key != "lt-r-k1" || ds[1].Attempt != 2 || ds[1].VShard != 1 ||
		string(ds[1].Payload) != `{"k":"lt-r-k1","pad":"xxxx"}` || ds[1].Receipt.text != "v1.abc1" || ds[1].ProducedAt.UnixMilli() != 1796227347951 {
		t.Fatalf("router answer read as %+v (ok %v)", ds, ok)
	}
}

// FuzzDecodeClaim: whatever decodeClaim takes, encoding/json takes and
// reads the same.
func FuzzDecodeClaim(f *testing.F) {
	f.Add([]byte(routerAnswer(2)))
	f.Add([]byte(`{"messages":[{"payload":[1,{"x":null}],"id":"5"},null]}`))
	f.Add([]byte(`{"x":"\u00e9","messages":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := decodeClaim(data)
		if !ok {
			return
		}
		want, err := byEncodingJSON(data)
		if err != nil {
			t.Fatalf("decodeClaim took %q, which encoding/json refuses: %v", data, err)
		}
		if err := sameDeliveries(fast, want); err != nil {
			t.Fatalf("%q: %v", data, err)
		}
	})
}

func BenchmarkDecodeClaim(b *testing.B) {
	data := []byte(routerAnswer(100))
	b.Run("decodeClaim", func(b *testing.B) {
		for b.Loop() {
			if _, ok := decodeClaim(data); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := byEncodingJSON(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
