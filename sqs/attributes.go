package sqs

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"regexp"
	"strings"
	"unicode/utf8"
)

// msgAttr is one message attribute as SQS carries it. BinaryValue is raw
// bytes (base64 on both wires, which encoding/json and the query form
// both use for blobs).
type msgAttr struct {
	DataType         string   `json:"DataType" xml:"DataType"`
	StringValue      *string  `json:"StringValue,omitempty" xml:"StringValue,omitempty"`
	BinaryValue      []byte   `json:"BinaryValue,omitempty" xml:"BinaryValue,omitempty"`
	StringListValues []string `json:"StringListValues,omitempty" xml:"-"`
	BinaryListValues [][]byte `json:"BinaryListValues,omitempty" xml:"-"`
}

// Message attributes travel as the message's headers, so that the
// router's own consumers see them too: each attribute is a header of its
// name whose value is its string (a Binary one's in base64), and the data
// types other than plain String are kept in the header typesHeader. A
// header written by a native producer reads as a String attribute. SQS
// reserves names starting with "AWS." for itself, so these two headers
// cannot collide with a client's attribute.
const (
	typesHeader = "AWS.SQS.DataTypes"
	traceHeader = "AWS.SQS.AWSTraceHeader"
	maxAttrs    = 10
)

var attrNameRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,256}$`)

// checkAttributes validates a message's attributes as SQS does and
// returns their size (names, types and values count against the
// message's size).
func checkAttributes(attrs map[string]msgAttr) (int, *apiError) {
	if len(attrs) > maxAttrs {
		return 0, errf(codeInvalidParameterValue, "a message has at most %d attributes, got %d", maxAttrs, len(attrs))
	}
	size := 0
	for name, a := range attrs {
		low := strings.ToLower(name)
		if !attrNameRE.MatchString(name) || strings.HasPrefix(low, "aws.") || strings.HasPrefix(low, "amazon.") ||
			strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".") || strings.Contains(name, "..") {
			return 0, errf(codeInvalidParameterValue, "message attribute name %q is invalid (letters, digits, _-.; not starting with AWS. or Amazon.)", name)
		}
		base, _, _ := strings.Cut(a.DataType, ".")
		if len(a.DataType) > 256 || (base != "String" && base != "Number" && base != "Binary") {
			return 0, errf(codeInvalidParameterValue, "message attribute %s has the data type %q: String, Number or Binary (optionally .custom)", name, a.DataType)
		}
		if len(a.StringListValues) > 0 || len(a.BinaryListValues) > 0 {
			return 0, errf(codeInvalidParameterValue, "message attribute %s: list values are not supported (nor by SQS)", name)
		}
		switch base {
		case "Binary":
			if a.BinaryValue == nil || a.StringValue != nil {
				return 0, errf(codeInvalidParameterValue, "message attribute %s of type Binary needs a BinaryValue (only)", name)
			}
			size += len(a.BinaryValue)
		default:
			if a.StringValue == nil || *a.StringValue == "" || a.BinaryValue != nil {
				return 0, errf(codeInvalidParameterValue, "message attribute %s of type %s needs a non-empty StringValue (only)", name, base)
			}
			if !validText(*a.StringValue) {
				return 0, errf(codeInvalidParameterValue, "message attribute %s has characters SQS does not allow", name)
			}
			size += len(*a.StringValue)
		}
		size += len(name) + len(a.DataType)
	}
	return size, nil
}

// validText reports whether s has only the characters SQS allows in a
// message: #x9 #xA #xD, #x20 to #xD7FF, #xE000 to #xFFFD, #x10000 to
// #x10FFFF.
func validText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF:
		case r >= 0xE000 && r <= 0xFFFD:
		case r >= 0x10000 && r <= 0x10FFFF:
		default:
			return false
		}
	}
	return true
}

// md5Hex is MD5OfMessageBody.
func md5Hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// md5OfAttributes is MD5OfMessageAttributes as SQS computes it (and SDKs
// check it): over the attributes sorted by name, each as its name, its
// data type (both with a 4-byte big-endian length), one byte for the
// transport (1 string, 2 binary) and its value with a 4-byte length.
// Empty for no attributes.
func md5OfAttributes(attrs map[string]msgAttr) string {
	if len(attrs) == 0 {
		return ""
	}
	h := md5.New()
	field := func(b []byte) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	for _, name := range sortedKeys(attrs) {
		a := attrs[name]
		field([]byte(name))
		field([]byte(a.DataType))
		if strings.HasPrefix(a.DataType, "Binary") {
			h.Write([]byte{2})
			field(a.BinaryValue)
		} else {
			h.Write([]byte{1})
			s := ""
			if a.StringValue != nil {
				s = *a.StringValue
			}
			field([]byte(s))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// encodeHeaders turns attributes (and an AWSTraceHeader) into the
// message's headers JSON, nil when there are none.
func encodeHeaders(attrs map[string]msgAttr, trace string) ([]byte, error) {
	if len(attrs) == 0 && trace == "" {
		return nil, nil
	}
	hdr := make(map[string]string, len(attrs)+2)
	types := map[string]string{}
	for name, a := range attrs {
		if strings.HasPrefix(a.DataType, "Binary") {
			hdr[name] = base64.StdEncoding.EncodeToString(a.BinaryValue)
		} else {
			hdr[name] = *a.StringValue
		}
		if a.DataType != "String" {
			types[name] = a.DataType
		}
	}
	if len(types) > 0 {
		t, err := json.Marshal(types)
		if err != nil {
			return nil, err
		}
		hdr[typesHeader] = string(t)
	}
	if trace != "" {
		hdr[traceHeader] = trace
	}
	return json.Marshal(hdr)
}

// decodeHeaders reads a message's headers back as attributes and its
// AWSTraceHeader. Headers that are not a JSON object of strings (none
// the router accepts) read as no attributes.
func decodeHeaders(raw []byte) (map[string]msgAttr, string) {
	if len(raw) == 0 {
		return nil, ""
	}
	var hdr map[string]string
	if json.Unmarshal(raw, &hdr) != nil {
		return nil, ""
	}
	types := map[string]string{}
	if t, ok := hdr[typesHeader]; ok {
		_ = json.Unmarshal([]byte(t), &types)
	}
	trace := hdr[traceHeader]
	out := make(map[string]msgAttr, len(hdr))
	for name, v := range hdr {
		if name == typesHeader || name == traceHeader {
			continue
		}
		dt := types[name]
		if dt == "" {
			dt = "String"
		}
		if strings.HasPrefix(dt, "Binary") {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				continue
			}
			out[name] = msgAttr{DataType: dt, BinaryValue: b}
			continue
		}
		if v == "" {
			continue // SQS has no empty string attribute; its MD5 would differ
		}
		out[name] = msgAttr{DataType: dt, StringValue: &v}
	}
	return out, trace
}

// selectAttributes keeps the attributes named by names: "All" or ".*"
// for every one, "prefix.*" for those starting with prefix., else exact
// names.
func selectAttributes(attrs map[string]msgAttr, names []string) map[string]msgAttr {
	if len(attrs) == 0 || len(names) == 0 {
		return nil
	}
	out := map[string]msgAttr{}
	for _, n := range names {
		switch {
		case n == "All" || n == ".*":
			return attrs
		case strings.HasSuffix(n, ".*"):
			p := strings.TrimSuffix(n, "*")
			for k, v := range attrs {
				if strings.HasPrefix(k, p) {
					out[k] = v
				}
			}
		default:
			if v, ok := attrs[n]; ok {
				out[n] = v
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// MarshalXML implements xml.Marshaler: a binary value is base64 text in
// XML as in JSON.
func (a msgAttr) MarshalXML(e *xml.Encoder, start xml.StartElement) error {
	v := struct {
		StringValue *string `xml:"StringValue,omitempty"`
		BinaryValue string  `xml:"BinaryValue,omitempty"`
		DataType    string  `xml:"DataType"`
	}{StringValue: a.StringValue, DataType: a.DataType}
	if a.BinaryValue != nil {
		v.BinaryValue = base64.StdEncoding.EncodeToString(a.BinaryValue)
	}
	return e.EncodeElement(v, start)
}
