package tlsconf_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/internal/tlsconf"
	"github.com/shardmq/shardmq/internal/tlsconf/certtest"
	"github.com/shardmq/shardmq/store"
)

// TestMySQLOverTLS starts a mariadbd with a certificate made here and
// connects through store.Open with DSNs that say tls=shardmq: a user that
// requires SSL and one that requires a client certificate get in, with
// the session encrypted; a plain connection, a connection without the
// client certificate and one trusting another CA are refused.
func TestMySQLOverTLS(t *testing.T) {
	testbed.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca := certtest.NewCA(t, dir, "mysql-ca")
	srvCert, srvKey := ca.Issue(t, dir, "mariadb", false)
	cliCert, cliKey := ca.Issue(t, dir, "router", true)
	bed, err := testbed.Start(ctx, testbed.Spec{Clusters: 1, NoReplicas: true,
		ServerArgs: []string{"--ssl-ca=" + ca.Path, "--ssl-cert=" + srvCert, "--ssl-key=" + srvKey}})
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Stop()
	primary := bed.Clusters[0].Primary
	root, err := sql.Open("mysql", primary.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, q := range []string{
		"CREATE USER 'tlsuser'@'127.0.0.1' IDENTIFIED BY 'pw' REQUIRE SSL",
		"GRANT ALL ON *.* TO 'tlsuser'@'127.0.0.1'",
		"CREATE USER 'x509user'@'127.0.0.1' IDENTIFIED BY 'pw' REQUIRE X509",
		"GRANT ALL ON *.* TO 'x509user'@'127.0.0.1'",
	} {
		if _, err := root.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	cfg, err := tlsconf.MySQLConfig(ca.Path, cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := tlsconf.RegisterMySQL(cfg); err != nil {
		t.Fatal(err)
	}
	caOnly, err := tlsconf.MySQLConfig(ca.Path, "", "")
	if err != nil {
		t.Fatal(err)
	}
	mysql.RegisterTLSConfig("test-ca-only", caOnly)
	otherCA := certtest.NewCA(t, t.TempDir(), "other-ca")
	wrong, err := tlsconf.MySQLConfig(otherCA.Path, "", "")
	if err != nil {
		t.Fatal(err)
	}
	mysql.RegisterTLSConfig("test-wrong-ca", wrong)

	dsn := func(user, tlsName string) string {
		d := fmt.Sprintf("%s:pw@tcp(%s)/", user, primary.Addr())
		if tlsName != "" {
			d += "?tls=" + tlsName
		}
		return d
	}
	for _, c := range []struct {
		name, dsn string
		ok        bool
	}{
		{"REQUIRE SSL over tls=shardmq", dsn("tlsuser", tlsconf.MySQLTLSName), true},
		{"REQUIRE X509 with the client certificate", dsn("x509user", tlsconf.MySQLTLSName), true},
		{"REQUIRE SSL without TLS", dsn("tlsuser", ""), false},
		{"REQUIRE X509 without a client certificate", dsn("x509user", "test-ca-only"), false},
		{"a server certificate from another CA", dsn("tlsuser", "test-wrong-ca"), false},
	} {
		st, err := store.Open(ctx, c.dsn, store.Options{MaxOpen: 2})
		if !c.ok {
			if err == nil {
				st.Close()
				t.Errorf("%s: connected, want refused", c.name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var name, version string
		err = st.DB().QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_version'").Scan(&name, &version)
		st.Close()
		if err != nil || !strings.HasPrefix(version, "TLSv1.") {
			t.Errorf("%s: session Ssl_version %q (%v), want TLSv1.x", c.name, version, err)
		}
	}
}
