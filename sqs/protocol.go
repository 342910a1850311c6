package sqs

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// The two wire protocols SQS clients speak. Current SDKs send AWS JSON 1.0
// (POST, X-Amz-Target: AmazonSQS.<Action>, a JSON body); older ones (boto3
// 1.26, the AWS CLI 2.9) send the query protocol (Action=<Action> and the
// parameters form-encoded, answered in XML). Both are decoded into the same
// request structs (their JSON shape) and answered from the same result
// structs, whose json tags give the JSON protocol's member names and whose
// xml tags give the query protocol's element names.

const (
	jsonTargetPrefix = "AmazonSQS."
	jsonContentType  = "application/x-amz-json-1.0"
	xmlNamespace     = "http://queue.amazonaws.com/doc/2012-11-05/"
)

// protocol says how a request came and how it is answered.
type protocol int

const (
	protoJSON protocol = iota
	protoQuery
)

// request is one decoded SQS call.
type request struct {
	proto  protocol
	action string
	// params is the call's input in the JSON protocol's shape (the query
	// protocol's parameters are folded into it by foldQuery).
	params json.RawMessage
	id     string // the request id of the answer
}

// IsSQS reports whether r is an SQS call: a POST to / with
// X-Amz-Target: AmazonSQS.*, or a request to / or to a queue's path
// (/<account>/<queue>) carrying Action= in its query or form body. The
// router sends such requests here and every other one to its own API.
func IsSQS(r *http.Request) bool {
	if strings.HasPrefix(r.Header.Get("X-Amz-Target"), jsonTargetPrefix) {
		return r.URL.Path == "/"
	}
	if r.URL.Path != "/" && !queuePath(r.URL.Path) {
		return false
	}
	if r.URL.Query().Has("Action") {
		return true
	}
	ct := r.Header.Get("Content-Type")
	return r.Method == http.MethodPost && strings.HasPrefix(strings.ToLower(ct), "application/x-www-form-urlencoded")
}

// queuePath reports whether p is /<12 digits>/<name>: a queue URL's path,
// which older clients post to.
func queuePath(p string) bool {
	acct, name, ok := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	if !ok || len(acct) != 12 || name == "" || strings.Contains(name, "/") {
		return false
	}
	for _, c := range acct {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// decodeRequest reads the call from r and its already-read body.
func decodeRequest(r *http.Request, body []byte) (*request, *apiError) {
	if t := r.Header.Get("X-Amz-Target"); t != "" {
		action, ok := strings.CutPrefix(t, jsonTargetPrefix)
		if !ok || action == "" {
			return nil, errInvalidAction(t)
		}
		req := &request{proto: protoJSON, action: action, params: body}
		if len(bytes.TrimSpace(body)) == 0 {
			req.params = json.RawMessage("{}")
		}
		if !json.Valid(req.params) {
			return nil, errf(codeSerialization, "the request body is not JSON")
		}
		return req, nil
	}
	form := r.URL.Query()
	if len(body) > 0 {
		fv, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, errf(codeMalformedQuery, "the form body does not parse: %v", err)
		}
		for k, vs := range fv {
			form[k] = append(form[k], vs...)
		}
	}
	action := form.Get("Action")
	if action == "" {
		return nil, errf(codeMissingAction, "no Action given")
	}
	params, err := foldQuery(form, r.URL.Path)
	if err != nil {
		return nil, errf(codeMalformedQuery, "%v", err)
	}
	return &request{proto: protoQuery, action: action, params: params}, nil
}

// queryNames renames the query protocol's parameter names to the JSON
// protocol's member names, and marks those whose list of {Name|Key, Value}
// entries is a map there.
var queryNames = map[string]struct {
	json  string
	isMap bool
}{
	"Attribute":                      {"Attributes", true},
	"Tag":                            {"Tags", true},
	"Tags":                           {"Tags", true},
	"MessageAttribute":               {"MessageAttributes", true},
	"MessageSystemAttribute":         {"MessageSystemAttributes", true},
	"AttributeName":                  {"AttributeNames", false},
	"MessageAttributeName":           {"MessageAttributeNames", false},
	"MessageSystemAttributeName":     {"MessageSystemAttributeNames", false},
	"TagKey":                         {"TagKeys", false},
	"StringListValue":                {"StringListValues", false},
	"BinaryListValue":                {"BinaryListValues", false},
	"SendMessageBatchRequestEntry":   {"Entries", false},
	"DeleteMessageBatchRequestEntry": {"Entries", false},
	"ChangeMessageVisibilityBatchRequestEntry": {"Entries", false},
}

// qnode is one dotted segment of the query parameters: "Entry.1.Id=x"
// is Entry → 1 → Id with the value x.
type qnode struct {
	value string
	leaf  bool
	kids  map[string]*qnode
}

// foldQuery turns flat query parameters into the JSON shape of the same
// call: dotted names nest, numbered segments become lists (in number
// order), and the lists of name/value entries that SQS's JSON protocol
// sends as maps become maps. A QueueUrl absent from the parameters is
// taken from a queue path the request was posted to.
func foldQuery(form url.Values, path string) (json.RawMessage, error) {
	root := &qnode{kids: map[string]*qnode{}}
	for k, vs := range form {
		if k == "Action" || k == "Version" || len(vs) == 0 {
			continue
		}
		n := root
		for _, seg := range strings.Split(k, ".") {
			if seg == "" {
				return nil, fmt.Errorf("parameter %q has an empty segment", k)
			}
			if n.kids == nil {
				n.kids = map[string]*qnode{}
			}
			c := n.kids[seg]
			if c == nil {
				c = &qnode{}
				n.kids[seg] = c
			}
			n = c
		}
		n.value, n.leaf = vs[0], true
	}
	if _, ok := root.kids["QueueUrl"]; !ok && queuePath(path) {
		root.kids["QueueUrl"] = &qnode{value: path, leaf: true}
	}
	v, err := root.toJSON("")
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func (n *qnode) toJSON(name string) (any, error) {
	if len(n.kids) == 0 {
		return n.value, nil
	}
	numbered := true
	for k := range n.kids {
		if _, err := strconv.Atoi(k); err != nil {
			numbered = false
		}
	}
	if numbered {
		idx := make([]int, 0, len(n.kids))
		for k := range n.kids {
			i, _ := strconv.Atoi(k)
			idx = append(idx, i)
		}
		sort.Ints(idx)
		list := make([]any, 0, len(idx))
		for _, i := range idx {
			v, err := n.kids[strconv.Itoa(i)].toJSON("")
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		if queryNames[name].isMap {
			return listToMap(name, list)
		}
		return list, nil
	}
	obj := map[string]any{}
	for k, c := range n.kids {
		v, err := c.toJSON(k)
		if err != nil {
			return nil, err
		}
		out := k
		if q, ok := queryNames[k]; ok {
			out = q.json
		}
		obj[out] = v
	}
	return obj, nil
}

// listToMap turns [{Name|Key: k, Value: v}, …] into {k: v, …}.
func listToMap(name string, list []any) (map[string]any, error) {
	m := make(map[string]any, len(list))
	for i, e := range list {
		o, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s.%d must have a name and a value", name, i+1)
		}
		k, ok := o["Name"].(string)
		if !ok {
			k, ok = o["Key"].(string)
		}
		if !ok {
			return nil, fmt.Errorf("%s.%d has no name", name, i+1)
		}
		m[k] = o["Value"]
	}
	return m, nil
}

// num is an integer parameter: a JSON number in the JSON protocol, a
// string in the query protocol. set tells a given 0 from an absent one.
type num struct {
	v   int64
	set bool
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *num) UnmarshalJSON(b []byte) error {
	s := string(b)
	if s == "null" {
		return nil
	}
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	n.v, n.set = v, true
	return nil
}

// decodeParams decodes a call's parameters into v.
func decodeParams(req *request, v any) *apiError {
	if err := json.Unmarshal(req.params, v); err != nil {
		var te *json.UnmarshalTypeError
		if ok := asTypeError(err, &te); ok {
			return errf(codeInvalidParameterValue, "parameter %s has the wrong type", te.Field)
		}
		return errf(codeInvalidParameterValue, "parameters do not decode: %v", err)
	}
	return nil
}

func asTypeError(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*te = t
	}
	return ok
}

// writeResult answers a successful call. result may be nil (actions that
// answer nothing but their request id).
func writeResult(w http.ResponseWriter, req *request, result any) {
	if req.proto == protoJSON {
		w.Header().Set("Content-Type", jsonContentType)
		w.Header().Set("X-Amzn-RequestId", req.id)
		body := []byte("{}")
		if result != nil {
			b, err := json.Marshal(result)
			if err != nil {
				writeError(w, req, errf(codeInternal, "encode answer: %v", err))
				return
			}
			body = b
		}
		w.WriteHeader(http.StatusOK)
		w.Write(body)
		return
	}
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	fmt.Fprintf(&buf, `<%sResponse xmlns="%s">`, req.action, xmlNamespace)
	if result != nil {
		enc := xml.NewEncoder(&buf)
		if err := enc.EncodeElement(result, xml.StartElement{Name: xml.Name{Local: req.action + "Result"}}); err != nil {
			writeError(w, req, errf(codeInternal, "encode answer: %v", err))
			return
		}
	}
	fmt.Fprintf(&buf, `<ResponseMetadata><RequestId>%s</RequestId></ResponseMetadata></%sResponse>`, req.id, req.action)
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("X-Amzn-RequestId", req.id)
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes())
}

// writeError answers a failed call in its protocol's error shape.
func writeError(w http.ResponseWriter, req *request, e *apiError) {
	proto, id := protoJSON, ""
	if req != nil {
		proto, id = req.proto, req.id
	}
	fault := "Sender"
	if e.statusCode() >= 500 {
		fault = "Receiver"
	}
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	w.Header().Set("X-Amzn-RequestId", id)
	if proto == protoJSON {
		w.Header().Set("Content-Type", jsonContentType)
		w.Header().Set("X-Amzn-Query-Error", e.code.query+";"+fault)
		body, _ := json.Marshal(map[string]string{"__type": "com.amazonaws.sqs#" + e.code.json, "message": e.message})
		w.WriteHeader(e.statusCode())
		w.Write(body)
		return
	}
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	buf.WriteString(`<ErrorResponse xmlns="` + xmlNamespace + `"><Error><Type>` + fault + `</Type><Code>`)
	xml.EscapeText(&buf, []byte(e.code.query))
	buf.WriteString(`</Code><Message>`)
	xml.EscapeText(&buf, []byte(e.message))
	buf.WriteString(`</Message><Detail/></Error><RequestId>` + id + `</RequestId></ErrorResponse>`)
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(e.statusCode())
	w.Write(buf.Bytes())
}

// attrMap is a string map: a JSON object in the JSON protocol, a
// flattened list of <Name>/<Value> (or <Key>/<Value>) entries in XML.
type attrMap map[string]string

// MarshalXML implements xml.Marshaler: one element named like the field
// per entry, in key order.
func (m attrMap) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	key := "Name"
	if start.Name.Local == "Tag" {
		key = "Key"
	}
	for _, k := range sortedKeys(m) {
		entry := []xml.Token{start, xml.StartElement{Name: xml.Name{Local: key}}, xml.CharData(k), xml.EndElement{Name: xml.Name{Local: key}},
			xml.StartElement{Name: xml.Name{Local: "Value"}}, xml.CharData(m[k]), xml.EndElement{Name: xml.Name{Local: "Value"}}, start.End()}
		for _, t := range entry {
			if err := e.EncodeToken(t); err != nil {
				return err
			}
		}
	}
	return nil
}

// msgAttrMap is a message's attributes, likewise a flattened list of
// <Name>/<Value> entries in XML.
type msgAttrMap map[string]msgAttr

// MarshalXML implements xml.Marshaler.
func (m msgAttrMap) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	for _, k := range sortedKeys(m) {
		entry := struct {
			Name  string  `xml:"Name"`
			Value msgAttr `xml:"Value"`
		}{k, m[k]}
		if err := e.EncodeElement(entry, start); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
