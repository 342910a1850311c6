package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/shardmq/shardmq/api"
	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/broker"
	"github.com/shardmq/shardmq/internal/tlsconf"
)

// SecurityConfig is who may use the router and how it is reached
// (docs/security.md). The zero value runs open on a loopback address.
type SecurityConfig struct {
	// TokensFile is the token file (hashes, scopes, rates), reloaded when
	// it changes. Empty (and no Tokens) runs the router open: no token is
	// asked for, and Listen refuses a non-loopback address unless
	// Insecure.
	TokensFile string
	// Tokens is a token store made by the caller instead of TokensFile
	// (auth.OpenConsul); the router starts and stops it.
	Tokens *auth.Store
	// Insecure lets a router without tokens listen on any address.
	Insecure bool
	// AllowedOrigins, AllowedHosts: see api.GuardConfig.
	AllowedOrigins []string
	AllowedHosts   []string
	// TLSCert and TLSKey are the listener's certificate and key (PEM),
	// reloaded when they change. Empty: plain HTTP.
	TLSCert, TLSKey string
	// MaxInFlight caps the requests served at once; beyond it the router
	// answers 503 overloaded. It must stay below HTTP.MaxConns (a request
	// holds a connection). Defaults to three quarters of HTTP.MaxConns
	// (768), or 4096 without a connection cap; negative disables.
	MaxInFlight int
	// AWSCredentialsFile is the SQS API's access-key file (auth.AccessKeys):
	// secrets in clear, readable by the router's user only, each key
	// acting as a token of the token file; reloaded when it changes.
	// Empty: no SQS call is served when the router has tokens.
	AWSCredentialsFile string
	// ReceiptKeyFile holds the key that signs receipts (at least 32
	// bytes; surrounding whitespace is ignored): a receipt made by one
	// router is acked at any other, so every router of a fleet must read
	// the same key. Empty: a random key of this router's own, valid only
	// while it runs and only on it (a router that serves alone).
	ReceiptKeyFile string
}

// receipts returns the receipt signer of c: the key file's, or a random
// key when there is none.
func (c SecurityConfig) receipts() (*broker.Receipts, error) {
	if c.ReceiptKeyFile == "" {
		return broker.RandomReceipts(), nil
	}
	data, err := os.ReadFile(c.ReceiptKeyFile)
	if err != nil {
		return nil, fmt.Errorf("config: receipt key: %w", err)
	}
	k, err := broker.NewReceipts(bytes.TrimSpace(data))
	if err != nil {
		return nil, fmt.Errorf("config: receipt key %s: %w", c.ReceiptKeyFile, err)
	}
	return k, nil
}

// security is the router's part that checks requests and secures the
// listener.
type security struct {
	tokens  *auth.Store      // nil: open
	keys    *auth.AccessKeys // the SQS API's access keys; nil: none
	certs   *tlsconf.CertFiles
	handler http.Handler
}

// secure puts the guard and the load shedder in front of the API.
func (r *Router) secure() error {
	c := r.cfg.Security
	sec := &security{}
	switch {
	case c.Tokens != nil && c.TokensFile != "":
		return errors.New("config: give the token file or a token store, not both")
	case c.Tokens != nil:
		sec.tokens = c.Tokens
	case c.TokensFile != "":
		st, err := auth.Open(c.TokensFile, r.cfg.ReloadEvery, r.cfg.Log)
		if err != nil {
			return err
		}
		sec.tokens = st
	}
	if sec.tokens != nil {
		sec.tokens.Start(context.Background())
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		sec.stop()
		return errors.New("config: TLS needs both the certificate and the key file")
	}
	if c.TLSCert != "" {
		cf, err := tlsconf.LoadCertFiles(c.TLSCert, c.TLSKey, r.cfg.Log)
		if err != nil {
			sec.stop()
			return err
		}
		sec.certs = cf
	}
	if err := api.CheckOrigins(c.AllowedOrigins); err != nil {
		return fmt.Errorf("config: -allowed-origins: %w", err)
	}
	gc := api.GuardConfig{AllowedOrigins: c.AllowedOrigins, AllowedHosts: c.AllowedHosts, Metrics: r.metrics, Log: r.cfg.Log, Now: r.cfg.Now}
	if sec.tokens != nil {
		gc.Tokens = sec.tokens
	}
	max := c.MaxInFlight // filled by Config.withDefaults (inFlightCap)
	h, err := r.withSQS(sec, r.api.Guard(gc))
	if err != nil {
		sec.stop()
		return err
	}
	sec.handler = api.NewShed(h, max, r.metrics)
	r.sec = sec
	return nil
}

func (s *security) stop() {
	if s != nil && s.tokens != nil {
		s.tokens.Stop()
	}
	if s != nil && s.keys != nil {
		s.keys.Stop()
	}
}

// checkListen refuses, before anything listens, to serve without tokens
// on an address others can reach, unless Insecure.
func (r *Router) checkListen() error {
	return checkListen(r.cfg.Listen, r.sec.tokens == nil, r.cfg.Security.Insecure)
}

func checkListen(addr string, open, insecure bool) error {
	if !open || insecure {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("listen %s: a router without a token file (-tokens) serves only a loopback address (127.0.0.1, ::1, localhost); give -tokens, or -insecure to let anyone who reaches it do anything", addr)
}

// secureListener adds TLS when configured.
func (r *Router) secureListener(ln net.Listener) (net.Listener, error) {
	if r.sec.certs != nil {
		return tls.NewListener(ln, r.sec.certs.ServerConfig()), nil
	}
	return ln, nil
}
