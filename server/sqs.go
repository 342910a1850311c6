package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/observe"
	"github.com/shardmq/shardmq/sqs"
)

// withSQS puts the SQS API (package sqs, docs/sqs.md) beside the guarded
// API on the same listener: requests sqs.IsSQS recognises go to it, every
// other one to next. It authenticates by its own access keys, which act
// as the token file's tokens.
func (r *Router) withSQS(sec *security, next http.Handler) (http.Handler, error) {
	c := r.cfg.SQS
	c.Metrics, c.Log, c.Now = r.metrics, r.cfg.Log, r.cfg.Now
	if path := r.cfg.Security.AWSCredentialsFile; path != "" {
		if sec.tokens == nil {
			return nil, errors.New("config: SQS access keys (-aws-credentials) act as tokens and need the token file (-tokens)")
		}
		keys, err := auth.OpenAccessKeys(path, r.cfg.ReloadEvery, r.cfg.Log)
		if err != nil {
			return nil, err
		}
		keys.Start(context.Background())
		sec.keys = keys
		c.Keys = keys
	}
	if sec.tokens != nil {
		c.Tokens = sec.tokens
	}
	h := sqs.New(c, observe.WrapBroker(r.broker, r.obs.msgs), r.subs)
	open := sec.tokens == nil
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !sqs.IsSQS(req) {
			next.ServeHTTP(w, req)
			return
		}
		if open && !localHost(req.Host) {
			// As the guard does for an open router: a rebound DNS name
			// never reaches it.
			http.Error(w, "host not served by an open router", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, req)
	}), nil
}

// localHost reports whether a Host header names localhost or an IP.
func localHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	return host == "localhost" || net.ParseIP(host) != nil
}
