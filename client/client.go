package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Config says how to reach a router.
type Config struct {
	// URL is the router's base URL, e.g. "http://127.0.0.1:8080" or
	// "https://mq.internal:8443". Required.
	URL string
	// Token is sent as "Authorization: Bearer <token>" (docs/security.md);
	// empty for a router without a token file.
	Token string
	// TLS configures HTTPS connections (a private CA in RootCAs, a
	// ServerName). Defaults to Go's defaults: the system's roots.
	TLS *tls.Config
	// Timeout bounds one request (a claim: Timeout plus its wait).
	// Defaults to 30s.
	Timeout time.Duration
	// MaxConns bounds the idle keep-alive connections kept to the router.
	// Defaults to 64.
	MaxConns int
	// HTTPClient replaces the client built from TLS and MaxConns.
	HTTPClient *http.Client
	// Logger receives what the client cannot return to a caller (a failed
	// lease extension, a release on stop). Defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.URL == "" {
		return c, errors.New("client: Config.URL is required")
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("client: Config.URL %q: want http(s)://host:port", c.URL)
	}
	c.URL = strings.TrimSuffix(c.URL, "/")
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.HTTPClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConns = c.MaxConns
		tr.MaxIdleConnsPerHost = c.MaxConns
		if c.TLS != nil {
			tr.TLSClientConfig = c.TLS.Clone()
		}
		c.HTTPClient = &http.Client{Transport: tr}
	}
	return c, nil
}

// Client talks to one router. It is safe for concurrent use; make one per
// router and share it.
type Client struct {
	cfg  Config
	auth string
	log  *slog.Logger
}

// New checks cfg and returns a Client. It makes no request.
func New(cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, log: cfg.Logger}
	if cfg.Token != "" {
		c.auth = "Bearer " + cfg.Token
	}
	return c, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.cfg.HTTPClient.CloseIdleConnections() }

// do sends body (JSON, nil for none) and decodes a 2xx answer into out.
// Any other answer is an *Error; a transport failure is returned wrapped.
func (c *Client) do(ctx context.Context, method, path string, body any, extra time.Duration, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout+extra)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	resp, err := c.cfg.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode), Message: strings.TrimSpace(string(data))}
		var w struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &w) == nil && w.Error.Code != "" {
			e.Code, e.Message = w.Error.Code, w.Error.Message
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
	}
	if ra, ok := out.(retryAfterSetter); ok {
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			ra.setRetryAfter(time.Duration(s) * time.Second)
		}
	}
	return nil
}

type retryAfterSetter interface{ setRetryAfter(time.Duration) }

func topicPath(topic string) string { return "/v1/topics/" + url.PathEscape(topic) }

func subscriptionPath(topic, sub string) string {
	return topicPath(topic) + "/subscriptions/" + url.PathEscape(sub)
}
