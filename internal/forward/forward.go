// Package forward carries a consume operation to the router that owns its
// unit (docs/consume.md, "Owners"): the same public request, marked so
// that the owner serves it itself and never forwards it again, with the
// client's own credentials.
package forward

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/domain"
	"github.com/shardmq/shardmq/store"
)

// Headers that mark a forwarded request. Anyone may send them: they only
// narrow what the router does (one cluster's share, no further
// forwarding), under the same token checks as any request.
const (
	// Header marks an ack, nack or extend the owner serves itself.
	Header = "X-Shardmq-Forwarded"
	// ClusterHeader names the one cluster a forwarded claim takes from.
	ClusterHeader = "X-Shardmq-Forwarded-Cluster"
)

type ctxKey int

const (
	authKey ctxKey = iota
	ridKey
)

// WithRequest keeps what a forwarded request must carry of the client's
// (its Authorization header and request id) in ctx.
func WithRequest(ctx context.Context, r *http.Request) context.Context {
	ctx = context.WithValue(ctx, authKey, r.Header.Get("Authorization"))
	return context.WithValue(ctx, ridKey, r.Header.Get("X-Request-Id"))
}

// Peer forwards to other routers over HTTP(S).
type Peer struct {
	client   *http.Client
	scheme   string
	receipts *broker.Receipts // the fleet's key: receipts go as the client gave them
}

var _ broker.Peer = (*Peer)(nil)

// New returns a peer; with tlsConfig set it speaks HTTPS. receipts signs
// the receipts it forwards and reads those a peer answers: the key every
// router of the fleet shares.
func New(tlsConfig *tls.Config, timeout time.Duration, receipts *broker.Receipts) *Peer {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute, TLSClientConfig: tlsConfig, ForceAttemptHTTP2: false}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Peer{client: &http.Client{Transport: tr, Timeout: timeout}, scheme: scheme, receipts: receipts}
}

// post sends body to addr's path with the forwarding header and decodes
// the answer into out.
func (p *Peer) post(ctx context.Context, addr, path string, hdr map[string]string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.scheme+"://"+addr+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if a, _ := ctx.Value(authKey).(string); a != "" {
		req.Header.Set("Authorization", a)
	}
	if rid, _ := ctx.Value(ridKey).(string); rid != "" {
		req.Header.Set("X-Request-Id", rid)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: forward to %s: %v", domain.ErrUnavailable, addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w: forward to %s: %v", domain.ErrUnavailable, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		json.Unmarshal(raw, &e)
		err := fmt.Errorf("router at %s answered %d %s: %s", addr, resp.StatusCode, e.Error.Code, e.Error.Message)
		if resp.StatusCode >= 500 {
			err = fmt.Errorf("%w: %v", domain.ErrUnavailable, err)
		}
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("forward to %s: decode the answer: %w", addr, err)
	}
	return nil
}

type claimed struct {
	ID            string            `json:"id"`
	Key           string            `json:"key"`
	Topic         string            `json:"topic"`
	VShard        int               `json:"vshard"`
	Payload       json.RawMessage   `json:"payload"`
	PayloadBase64 *string           `json:"payload_base64"`
	Headers       map[string]string `json:"headers"`
	Priority      int               `json:"priority"`
	OrderKey      string            `json:"order_key"`
	TransactionID string            `json:"transaction_id"`
	ProducedAt    string            `json:"produced_at"`
	Attempt       int               `json:"attempt"`
	Receipt       string            `json:"receipt"`
	LeaseExpires  string            `json:"lease_expires_at"`
}

// Claim asks the router at addr for one cluster's share of a claim.
func (p *Peer) Claim(ctx context.Context, addr, cluster string, req broker.ClaimRequest) ([]broker.Delivery, error) {
	body := map[string]any{"max": req.Max, "visibility_timeout_ms": req.Lease.Milliseconds(), "consumer": req.Consumer}
	if req.MaxBytes > 0 {
		body["max_bytes"] = req.MaxBytes
	}
	var out struct {
		Messages []claimed `json:"messages"`
	}
	path := "/v1/topics/" + req.Topic + "/subscriptions/" + req.Subscription + "/claim"
	if err := p.post(ctx, addr, path, map[string]string{ClusterHeader: cluster}, body, &out); err != nil {
		return nil, err
	}
	ds := make([]broker.Delivery, 0, len(out.Messages))
	for _, c := range out.Messages {
		d, err := c.delivery(p.receipts)
		if err != nil {
			return nil, fmt.Errorf("forward to %s: %w", addr, err)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

func (c claimed) delivery(receipts *broker.Receipts) (broker.Delivery, error) {
	id, err := strconv.ParseUint(c.ID, 10, 64)
	if err != nil {
		return broker.Delivery{}, fmt.Errorf("message id %q: %w", c.ID, err)
	}
	r, err := receipts.Decode(c.Receipt)
	if err != nil {
		return broker.Delivery{}, err
	}
	m := &store.Message{ID: id, VShard: uint16(c.VShard), Topic: c.Topic, Key: c.Key, OrderKey: c.OrderKey, TransactionID: c.TransactionID,
		Priority: c.Priority}
	if c.PayloadBase64 != nil {
		if m.Payload, err = base64.StdEncoding.DecodeString(*c.PayloadBase64); err != nil {
			return broker.Delivery{}, fmt.Errorf("payload_base64: %w", err)
		}
	} else {
		m.Payload, m.PayloadJSON = []byte(c.Payload), true
	}
	if len(c.Headers) > 0 {
		if m.Headers, err = json.Marshal(c.Headers); err != nil {
			return broker.Delivery{}, err
		}
	}
	if m.CreatedAt, err = time.Parse(time.RFC3339Nano, c.ProducedAt); err != nil {
		return broker.Delivery{}, fmt.Errorf("produced_at: %w", err)
	}
	exp, err := time.Parse(time.RFC3339Nano, c.LeaseExpires)
	if err != nil {
		return broker.Delivery{}, fmt.Errorf("lease_expires_at: %w", err)
	}
	return broker.Delivery{Claimed: store.Claimed{Message: m, Attempt: c.Attempt, Token: r.Token, LeaseExpires: exp}, Receipt: c.Receipt}, nil
}

type leaseOut struct {
	Status  domain.LeaseStatus `json:"status"`
	Expires string             `json:"lease_expires_at"`
	Error   *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (l leaseOut) result() broker.LeaseResult {
	r := broker.LeaseResult{Status: l.Status}
	if l.Expires != "" {
		r.Expires, _ = time.Parse(time.RFC3339Nano, l.Expires)
	}
	if l.Error != nil {
		r.Err = fmt.Errorf("%w: %s", domain.ErrUnavailable, l.Error.Message)
	}
	return r
}

func (p *Peer) encodeAll(receipts []broker.Receipt) []string {
	out := make([]string, len(receipts))
	for i, r := range receipts {
		out[i] = p.receipts.Encode(r)
	}
	return out
}

// Ack forwards acks to the router at addr.
func (p *Peer) Ack(ctx context.Context, addr string, receipts []broker.Receipt) ([]broker.LeaseResult, error) {
	return p.leases(ctx, addr, "/v1/ack", map[string]any{"receipts": p.encodeAll(receipts)}, len(receipts))
}

// Extend forwards extends to the router at addr.
func (p *Peer) Extend(ctx context.Context, addr string, receipts []broker.Receipt, lease time.Duration) ([]broker.LeaseResult, error) {
	return p.leases(ctx, addr, "/v1/extend", map[string]any{"receipts": p.encodeAll(receipts), "visibility_timeout_ms": lease.Milliseconds()}, len(receipts))
}

func (p *Peer) leases(ctx context.Context, addr, path string, body any, n int) ([]broker.LeaseResult, error) {
	var out struct {
		Results []leaseOut `json:"results"`
	}
	if err := p.post(ctx, addr, path, map[string]string{Header: "1"}, body, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != n {
		return nil, fmt.Errorf("%w: router at %s answered %d results for %d receipts", domain.ErrUnavailable, addr, len(out.Results), n)
	}
	res := make([]broker.LeaseResult, n)
	for i, l := range out.Results {
		res[i] = l.result()
	}
	return res, nil
}

// Nack forwards nacks to the router at addr.
func (p *Peer) Nack(ctx context.Context, addr string, items []broker.NackItem) ([]broker.NackResult, error) {
	type item struct {
		Receipt      string `json:"receipt"`
		ErrorCode    string `json:"error_code,omitempty"`
		Error        string `json:"error,omitempty"`
		RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
	}
	in := make([]item, len(items))
	for i, it := range items {
		in[i] = item{Receipt: p.receipts.Encode(it.Receipt), ErrorCode: it.ErrorCode, Error: it.Error}
		if it.RetryAfter > 0 || it.RetryNow {
			ms := it.RetryAfter.Milliseconds()
			in[i].RetryAfterMS = &ms
		}
	}
	var out struct {
		Results []struct {
			Status        domain.NackStatus `json:"status"`
			NextAttemptAt string            `json:"next_attempt_at"`
			Error         *struct {
				Message string `json:"message"`
			} `json:"error"`
		} `json:"results"`
	}
	if err := p.post(ctx, addr, "/v1/nack", map[string]string{Header: "1"}, map[string]any{"items": in}, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(items) {
		return nil, fmt.Errorf("%w: router at %s answered %d results for %d items", domain.ErrUnavailable, addr, len(out.Results), len(items))
	}
	res := make([]broker.NackResult, len(items))
	for i, n := range out.Results {
		res[i] = broker.NackResult{Status: n.Status}
		if n.NextAttemptAt != "" {
			res[i].NextAttemptAt, _ = time.Parse(time.RFC3339Nano, n.NextAttemptAt)
		}
		if n.Error != nil {
			res[i].Err = errors.New(n.Error.Message)
		}
	}
	return res, nil
}
