package main

import (
	"flag"
	"strings"

	"github.com/shardmq/shardmq/internal/tlsconf"
	"github.com/shardmq/shardmq/server"
)

// securityFlags are the flags of docs/security.md.
type securityFlags struct {
	origins, hosts               string
	mysqlCA, mysqlCert, mysqlKey string
}

func addSecurityFlags(fs *flag.FlagSet, c *server.SecurityConfig) *securityFlags {
	f := &securityFlags{}
	fs.StringVar(&c.TokensFile, "tokens", "", "API token file (hashes, scopes, rates; reloaded on change). Without it the router asks for no token and serves only a loopback address")
	fs.BoolVar(&c.Insecure, "insecure", false, "let a router without -tokens listen on a non-loopback address (anyone who reaches it can do anything)")
	fs.StringVar(&f.origins, "allowed-origins", "", "comma-separated browser origins (https://ops.example.com) whose requests are served; any other Origin header is refused")
	fs.StringVar(&f.hosts, "allowed-hosts", "", "comma-separated host names the Host header may carry (default: any with -tokens; localhost and IP literals without)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; reloaded when it changes)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "the -tls-cert's private key (PEM)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", 0, "requests served at once before the router answers 503 overloaded (default 4096; negative disables)")
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
