package api

import "testing"

// A JSON payload is stored compact: as sent when it holds no whitespace
// byte, without its insignificant whitespace otherwise (whitespace inside
// strings stays).
func TestProducePayloadStoredCompact(t *testing.T) {
	t.Parallel()
	s := New(nil, Limits{}, nil, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"messages":[{"payload":{"a":[1,2],"b":"x"}}]}`, `{"a":[1,2],"b":"x"}`},
		{"{\"messages\":[{\"payload\": { \"a\" : [1, 2],\n\t\"b\":\"x y\" }\r\n}]}", `{"a":[1,2],"b":"x y"}`},
		{`{"messages":[{"payload":"a b"}]}`, `"a b"`},
		{`{"messages":[{"payload":7}]}`, `7`},
	} {
		var req produceRequest
		if e := decodeStrict([]byte(tc.body), &req); e != nil {
			t.Fatalf("%s: %v", tc.body, e)
		}
		msgs, e := s.validateProduce(&req)
		if e != nil {
			t.Fatalf("%s: %v", tc.body, e)
		}
		if got := string(msgs[0].Payload); got != tc.want || !msgs[0].PayloadJSON {
			t.Errorf("%q: stored %q (json %v), want %q", tc.body, got, msgs[0].PayloadJSON, tc.want)
		}
	}
}
