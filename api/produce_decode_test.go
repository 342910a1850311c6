package api

import (
	"reflect"
	"strings"
	"testing"

	"github.com/shardmq/shardmq/api/apitest"
)

// loadtestBody is a produce body of the shape the load tester sends: 100
// messages with a key and a JSON object payload of about 200 bytes.
func loadtestBody() []byte {
	var sb strings.Builder
	sb.WriteString(`{"messages":[`)
	for i := range 100 {
		if i > 0 {
			sb.WriteByte(',')
		}
		key := "run1.k" + strings.Repeat("7", i%5+3)
		sb.WriteString(`{"key":"` + key + `","payload":{"k":"` + key + `","p":"` + strings.Repeat("x", 180) + `"}}`)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

// sameAsStrict checks that decodeProduce answers body exactly as
// decodeStrict does, and reports whether its single pass took it.
func sameAsStrict(t *testing.T, body []byte) bool {
	t.Helper()
	var fast, want produceRequest
	e := decodeProduce(body, &fast)
	we := decodeStrict(body, &want)
	if !reflect.DeepEqual(e, we) {
		t.Fatalf("%q: decodeProduce answered %v, decodeStrict %v", body, e, we)
	}
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("%q: decodeProduce decoded %#v, decodeStrict %#v", body, fast, want)
	}
	var req produceRequest
	d := produceDecoder{b: body}
	return d.request(&req)
}

func TestDecodeProduceTakesTheCommonShapeInOnePass(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		string(produceBody()),
		string(loadtestBody()),
		` {"durability":"replicated","messages":[]} `,
		`{"messages":[{"key":"k","payload":"\ud83d\ude00 \n\"x\"","headers":{},"priority":-0,"delay_ms":123456789012345,` +
			`"deliver_at":"2026-01-02T03:04:05Z","order_key":"o","transaction_id":"tx-é"}]}`,
		`{"messages":[{"payload":[1,-2.5e+3,0.0,true,false,null,{"a":{"a":[]}},[[]]] ,"payload_base64":"AAEC/w=="}]}`,
	} {
		if !sameAsStrict(t, []byte(body)) {
			t.Errorf("%q was left to decodeStrict", body)
		}
	}
}

func TestDecodeProduceLeavesTheRestToDecodeStrict(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		``, ` `, `null`, `[]`, `{"messages":null}`, `{"messages":[null]}`, `{"messages":[{"key":null}]}`,
		`{"messages":[{"key":"a\u0062"}]}`, `{"messages":[{"Key":"a"}]}`, `{"messages":[{"key":"a","key":"b"}]}`,
		`{"messages":[],"messages":[]}`, `{"messages":[{"payload":{"a":1,"a":2}}]}`, `{"messages":[{"payload":{"a":1,"\u0061":2}}]}`,
		`{"messages":[{"payload":"\udc00"}]}`, `{"messages":[{"payload":"\ud800x"}]}`, `{"messages":[{"payload":"\ud800\u0041"}]}`,
		"{\"messages\":[{\"payload\":\"\xff\"}]}", "{\"messages\":[{\"key\":\"\xc3\"}]}", `{"messages":[{"payload":01}]}`,
		`{"messages":[{"payload":1.}]}`, `{"messages":[{"payload":-}]}`, `{"messages":[{"payload":1e}]}`, `{"messages":[{"payload":tru}]}`,
		`{"messages":[{"priority":1.0}]}`, `{"messages":[{"priority":1e1}]}`, `{"messages":[{"priority":"1"}]}`,
		`{"messages":[{"priority":99999999999999999999}]}`, `{"messages":[{"delay_ms":1234567890123456}]}`,
		`{"messages":[{"headers":{"a":"b","a":"c"}}]}`, `{"messages":[{"headers":{"a":1}}]}`, `{"messages":[{"payload":{}}]} x`,
		`{"messages":[{"payload":{}}]}{}`, `{"messages":[{"payload":"a` + "\t" + `"}]}`, `{"messages":[{"payload":{}},]}`,
		`{"messages":[{"payload":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}]}`,
		`{"messages":[{"payload":{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17}}]}`,
	} {
		if sameAsStrict(t, []byte(body)) {
			t.Errorf("%q was taken by the single pass", body)
		}
	}
}

func TestDecodeProduceAnswersBadRequestsAsDecodeStrict(t *testing.T) {
	t.Parallel()
	for _, tc := range apitest.BadRequests(testReceipt(t)) {
		if tc.Method == "POST" && strings.HasSuffix(tc.Target, "/messages") {
			sameAsStrict(t, []byte(tc.Body))
		}
	}
}

func FuzzDecodeProduce(f *testing.F) {
	for _, s := range []string{
		string(produceBody()), `{"messages":[{"key":"k","payload":{"a":[1,2.5e3,"\u00e9"]},"priority":3}]}`,
		`{"messages":[{"payload_base64":"AAEC/w==","headers":{"a":"b"},"delay_ms":5,"order_key":"o"}],"durability":"replicated"}`,
		`{"messages":[{"payload":"\ud83d\ude00","deliver_at":"2026-01-02T03:04:05Z","transaction_id":"t"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { sameAsStrict(t, body) })
}
