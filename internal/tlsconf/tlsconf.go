// Package tlsconf builds the router's TLS configurations: the listener's
// certificate, reloaded when its files change, and the client side of
// MySQL connections (a CA to trust, optionally a client certificate).
package tlsconf

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// CertFiles serves a certificate and key from two PEM files, loading them
// again when either changes (checked at most once per CheckEvery during
// handshakes), so a renewed certificate is used without a restart. A pair
// that does not load (the key written but not yet the certificate) is
// logged and the last good one stays in use.
type CertFiles struct {
	certPath, keyPath string
	checkEvery        time.Duration
	log               *slog.Logger
	now               func() time.Time

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   [2]fileStamp
	checked time.Time
}

type fileStamp struct {
	mod  time.Time
	size int64
}

// LoadCertFiles loads the pair once; it fails when it does not load.
func LoadCertFiles(certPath, keyPath string, log *slog.Logger) (*CertFiles, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &CertFiles{certPath: certPath, keyPath: keyPath, checkEvery: time.Second, log: log, now: time.Now}
	stamp := c.stamps()
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s / key %s: %w", certPath, keyPath, err)
	}
	c.cur, c.stamp, c.checked = &cert, stamp, c.now()
	return c, nil
}

func (c *CertFiles) stamps() [2]fileStamp {
	var out [2]fileStamp
	for i, p := range []string{c.certPath, c.keyPath} {
		if fi, err := os.Stat(p); err == nil {
			out[i] = fileStamp{mod: fi.ModTime(), size: fi.Size()}
		}
	}
	return out
}

// GetCertificate is tls.Config.GetCertificate.
func (c *CertFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if d := now.Sub(c.checked); d >= 0 && d < c.checkEvery {
		return c.cur, nil
	}
	c.checked = now
	stamp := c.stamps()
	if stamp == c.stamp {
		return c.cur, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		c.log.Error("TLS certificate changed but does not load; keeping the one in use", "cert", c.certPath, "key", c.keyPath, "err", err)
		return c.cur, nil
	}
	c.cur, c.stamp = &cert, stamp
	c.log.Info("TLS certificate reloaded", "cert", c.certPath)
	return c.cur, nil
}

// ServerConfig is the listener's TLS configuration (TLS 1.2 and up).
func (c *CertFiles) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate}
}

// MySQLTLSName is the name under which RegisterMySQL registers the
// configuration: DSNs select it with tls=shardmq.
const MySQLTLSName = "shardmq"

// MySQLConfig is the client TLS configuration of MySQL connections: the
// server's certificate must be signed by the CA in caPath (the system's
// roots when empty) and name the DSN's host (go-sql-driver sets the
// server name from the DSN); certPath and keyPath, when given, are the
// client certificate for servers that ask for one (REQUIRE X509).
func MySQLConfig(caPath, certPath, keyPath string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caPath != "" {
		pem, err := os.ReadFile(caPath)
		if err != nil {
			return nil, fmt.Errorf("MySQL CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bytes.TrimSpace(pem)) {
			return nil, fmt.Errorf("MySQL CA %s: no PEM certificate in it", caPath)
		}
		cfg.RootCAs = pool
	}
	if (certPath == "") != (keyPath == "") {
		return nil, errors.New("MySQL client certificate: give both the certificate and the key")
	}
	if certPath != "" {
		cert, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("MySQL client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// RegisterMySQL registers cfg with go-sql-driver under MySQLTLSName. The
// driver keeps such configurations process-wide, so only a main calls it.
func RegisterMySQL(cfg *tls.Config) error {
	if err := mysql.RegisterTLSConfig(MySQLTLSName, cfg); err != nil {
		return fmt.Errorf("register MySQL TLS configuration: %w", err)
	}
	return nil
}
