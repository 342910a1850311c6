package sqs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// AWS Signature Version 4, as SQS clients sign: the router recomputes the
// signature from the request as it arrived and the secret of the access
// key it names, and serves the request only when they are equal
// (docs/security.md, "SQS").

const (
	sigAlgorithm = "AWS4-HMAC-SHA256"
	sigTimeFmt   = "20060102T150405Z"
	sigService   = "sqs"
	// MaxClockSkew is how far a request's X-Amz-Date may be from the
	// router's clock, either way.
	MaxClockSkew = 15 * time.Minute
)

// sigHeader is a parsed Authorization header.
type sigHeader struct {
	accessKey, date, region, service string
	signedHeaders                    []string
	signature                        string
}

// parseAuthorization reads "AWS4-HMAC-SHA256 Credential=AK/20261201/us-east-1/sqs/aws4_request,
// SignedHeaders=host;x-amz-date, Signature=hex".
func parseAuthorization(h string) (sigHeader, *apiError) {
	var s sigHeader
	alg, rest, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || alg != sigAlgorithm {
		return s, errf(codeIncompleteSig, "the Authorization header must be an %s signature", sigAlgorithm)
	}
	var cred, signed string
	for _, part := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			s.signature = v
		}
	}
	scope := strings.Split(cred, "/")
	if len(scope) != 5 || scope[4] != "aws4_request" || signed == "" || len(s.signature) != 64 {
		return s, errf(codeIncompleteSig, "the Authorization header needs Credential=key/date/region/service/aws4_request, SignedHeaders and Signature")
	}
	s.accessKey, s.date, s.region, s.service = scope[0], scope[1], scope[2], scope[3]
	s.signedHeaders = strings.Split(signed, ";")
	return s, nil
}

// verifySignature checks r's signature against secret. body is the
// request body as read; now is the router's clock.
func verifySignature(r *http.Request, body []byte, s sigHeader, secret string, now time.Time) *apiError {
	if s.service != sigService {
		return errf(codeSignatureMismatch, "the credential scope names service %q, not %q", s.service, sigService)
	}
	amzDate := r.Header.Get("X-Amz-Date")
	if amzDate == "" {
		return errf(codeIncompleteSig, "the request has no X-Amz-Date header")
	}
	at, err := time.Parse(sigTimeFmt, amzDate)
	if err != nil {
		return errf(codeIncompleteSig, "X-Amz-Date %q is not of the form 20060102T150405Z", amzDate)
	}
	if d := now.Sub(at); d > MaxClockSkew || d < -MaxClockSkew {
		return errf(codeRequestExpired, "the request was signed at %s, more than %v from the router's time %s", amzDate, MaxClockSkew, now.UTC().Format(sigTimeFmt))
	}
	if s.date != amzDate[:8] {
		return errf(codeSignatureMismatch, "the credential scope's date %s is not the day of X-Amz-Date", s.date)
	}
	signsHost := false
	for _, h := range s.signedHeaders {
		if h == "host" {
			signsHost = true
		}
	}
	if !signsHost || !sort.StringsAreSorted(s.signedHeaders) {
		return errf(codeSignatureMismatch, "SignedHeaders must be sorted and include host")
	}
	payload := sha256.Sum256(body)
	payloadHash := hex.EncodeToString(payload[:])
	if h := r.Header.Get("X-Amz-Content-Sha256"); h != "" && h != payloadHash {
		return errf(codeSignatureMismatch, "X-Amz-Content-Sha256 is not the body's SHA-256")
	}
	want := signature(secret, s.date, s.region, sigService, amzDate, canonicalRequest(r, s.signedHeaders, payloadHash))
	if !hmac.Equal([]byte(want), []byte(strings.ToLower(s.signature))) {
		return errf(codeSignatureMismatch, "the request signature we calculated does not match the signature you provided; check your AWS secret access key and signing method")
	}
	return nil
}

// signature is the hex HMAC of the string to sign under the key derived
// from secret for the day, region and service.
func signature(secret, day, region, service, amzDate, canonical string) string {
	scope := day + "/" + region + "/" + service + "/aws4_request"
	ch := sha256.Sum256([]byte(canonical))
	toSign := sigAlgorithm + "\n" + amzDate + "\n" + scope + "\n" + hex.EncodeToString(ch[:])
	k := hmacSHA256([]byte("AWS4"+secret), day)
	k = hmacSHA256(k, region)
	k = hmacSHA256(k, service)
	k = hmacSHA256(k, "aws4_request")
	return hex.EncodeToString(hmacSHA256(k, toSign))
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// canonicalRequest is SigV4's canonical form of r: method, the path
// (each segment encoded again, as for every service but S3), the sorted
// query, the signed headers and the payload's hash.
func canonicalRequest(r *http.Request, signed []string, payloadHash string) string {
	var b strings.Builder
	b.WriteString(r.Method)
	b.WriteByte('\n')
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = uriEncode(s)
	}
	b.WriteString(strings.Join(segs, "/"))
	b.WriteByte('\n')
	b.WriteString(canonicalQuery(r.URL.RawQuery))
	b.WriteByte('\n')
	for _, h := range signed {
		b.WriteString(h)
		b.WriteByte(':')
		b.WriteString(headerValue(r, h))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	b.WriteString(strings.Join(signed, ";"))
	b.WriteByte('\n')
	b.WriteString(payloadHash)
	return b.String()
}

// headerValue is a signed header's canonical value: its values joined by
// commas, each trimmed with inner runs of spaces collapsed. Go keeps Host
// and Content-Length outside Header.
func headerValue(r *http.Request, name string) string {
	var vals []string
	switch name {
	case "host":
		vals = []string{r.Host}
	case "content-length":
		vals = r.Header.Values("Content-Length")
		if len(vals) == 0 && r.ContentLength >= 0 {
			vals = []string{strconv.FormatInt(r.ContentLength, 10)}
		}
	default:
		vals = r.Header.Values(name)
	}
	for i, v := range vals {
		vals[i] = strings.Join(strings.Fields(v), " ")
	}
	return strings.Join(vals, ",")
}

// canonicalQuery sorts the query's parameters by name, then value, each
// encoded as SigV4 encodes.
func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var pairs []string
	for _, kv := range strings.Split(raw, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		uk, err1 := url.QueryUnescape(k)
		uv, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			uk, uv = k, v
		}
		pairs = append(pairs, uriEncode(uk)+"="+uriEncode(uv))
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "&")
}

// uriEncode percent-encodes every byte but the unreserved characters
// (A-Z a-z 0-9 - _ . ~), in upper-case hex.
func uriEncode(s string) string {
	const hexdig = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdig[c>>4])
		b.WriteByte(hexdig[c&15])
	}
	return b.String()
}

// Sign signs req (whose body is body) for SQS as an SDK does, with the
// headers host, x-amz-date and, when set, content-type and x-amz-target.
// It is for shardmq's own SQS callers (the load tester, tests); SDKs sign
// with their own signer.
func Sign(req *http.Request, body []byte, accessKey, secret, region string, now time.Time) {
	amzDate := now.UTC().Format(sigTimeFmt)
	req.Header.Set("X-Amz-Date", amzDate)
	signed := []string{"host", "x-amz-date"}
	for _, h := range []string{"content-type", "x-amz-target"} {
		if req.Header.Get(h) != "" {
			signed = append(signed, h)
		}
	}
	sort.Strings(signed)
	if req.Host == "" {
		req.Host = req.URL.Host
	}
	sum := sha256.Sum256(body)
	sig := signature(secret, amzDate[:8], region, sigService, amzDate, canonicalRequest(req, signed, hex.EncodeToString(sum[:])))
	req.Header.Set("Authorization", sigAlgorithm+" Credential="+accessKey+"/"+amzDate[:8]+"/"+region+"/"+sigService+
		"/aws4_request, SignedHeaders="+strings.Join(signed, ";")+", Signature="+sig)
}
