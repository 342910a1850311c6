package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/tlsconf"
	"github.com/shardmq/shardmq/server"
)

// securityFlags are the flags of docs/security.md.
type securityFlags struct {
	consulTokens                 bool
	origins, hosts               string
	mysqlCA, mysqlCert, mysqlKey string
}

func addSecurityFlags(fs *flag.FlagSet, c *server.SecurityConfig) *securityFlags {
	f := &securityFlags{}
	fs.StringVar(&c.TokensFile, "tokens", "", "API token file (hashes, scopes, rates; reloaded on change). Without it the router asks for no token and serves only a loopback address")
	fs.BoolVar(&f.consulTokens, "tokens-consul", false, "read the token file from the Consul KV key <consul-prefix>tokens (with -consul-addr), following its changes, instead of -tokens")
	fs.BoolVar(&c.Insecure, "insecure", false, "let a router without -tokens listen on a non-loopback address (anyone who reaches it can do anything)")
	fs.StringVar(&f.origins, "allowed-origins", "", "comma-separated browser origins (https://ops.example.com) whose requests are served; any other Origin header is refused")
	fs.StringVar(&f.hosts, "allowed-hosts", "", "comma-separated host names the Host header may carry (default: any with -tokens; localhost and IP literals without)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; reloaded when it changes)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "the -tls-cert's private key (PEM)")
	fs.StringVar(&c.AWSCredentialsFile, "aws-credentials", "", "the SQS API's access-key file (secrets in clear, mode 0600, each key acting as a token of -tokens; reloaded on change; docs/sqs.md)")
	fs.StringVar(&c.ReceiptKeyFile, "receipt-key-file", "", "file holding the key (at least 32 bytes) that signs receipts; every router of a fleet must read the same key (default: a random key of this router's own, for a router that serves alone)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", 0, "requests served at once before the router answers 503 overloaded; must be below -max-conns (default three quarters of -max-conns, 768; negative disables)")
	fs.StringVar(&f.mysqlCA, "mysql-ca", "", "CA certificate (PEM) MySQL servers' certificates must chain to; DSNs with tls=shardmq use it")
	fs.StringVar(&f.mysqlCert, "mysql-cert", "", "client certificate (PEM) for MySQL servers that require one (tls=shardmq)")
	fs.StringVar(&f.mysqlKey, "mysql-key", "", "the -mysql-cert's private key (PEM)")
	return f
}

// apply fills the lists and registers the MySQL TLS configuration named
// shardmq when a -mysql-ca or -mysql-cert is given.
func (f *securityFlags) apply(c *server.SecurityConfig) error {
	c.AllowedOrigins = splitList(f.origins)
	c.AllowedHosts = splitList(f.hosts)
	if f.mysqlCA == "" && f.mysqlCert == "" && f.mysqlKey == "" {
		return nil
	}
	cfg, err := tlsconf.MySQLConfig(f.mysqlCA, f.mysqlCert, f.mysqlKey)
	if err != nil {
		return err
	}
	return tlsconf.RegisterMySQL(cfg)
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// openConsulTokens points the router at the token file in Consul KV when
// -tokens-consul is given.
func (f *securityFlags) openConsulTokens(ctx context.Context, co *consulOptions, cfg *server.Config) error {
	if !f.consulTokens {
		return nil
	}
	if co.addr == "" {
		return errors.New("-tokens-consul needs -consul-addr")
	}
	if cfg.Security.TokensFile != "" {
		return errors.New("give -tokens or -tokens-consul, not both")
	}
	cc := consulapi.DefaultConfig()
	cc.Address = co.addr
	client, err := consulapi.NewClient(cc)
	if err != nil {
		return fmt.Errorf("consul: %w", err)
	}
	prefix := strings.TrimPrefix(co.prefix, "/")
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	st, err := auth.OpenConsul(ctx, client.KV(), prefix+auth.ConsulKey, cfg.Log)
	if err != nil {
		return err
	}
	cfg.Security.Tokens = st
	return nil
}
