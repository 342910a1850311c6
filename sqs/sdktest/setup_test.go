package sdktest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"

	"github.com/shardmq/shardmq/auth"
	"github.com/shardmq/shardmq/internal/routertest"
	"github.com/shardmq/shardmq/internal/testbed"
	"github.com/shardmq/shardmq/server"
)

var bed *testbed.Bed

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Spec{Clusters: 2, Replicas: 1}, func(b *testbed.Bed) { bed = b }))
}

// env is a router over the test bed with two access keys: one acting as
// an admin token on every topic, one as a produce-only token.
type env struct {
	url      string
	admin    key
	producer key
	// creds is an AWS shared-credentials file with the profiles
	// "default" (admin) and "producer".
	creds string
}

type key struct{ id, secret string }

func setup(t *testing.T) *env {
	t.Helper()
	e := &env{}
	dir := t.TempDir()
	r := routertest.Start(t, bed, routertest.Options{Token: true, Tune: func(cfg *server.Config) {
		secret, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		ft := auth.FileToken{Name: "producer", SHA256: auth.Hash(secret), Scopes: map[auth.Scope][]string{auth.Produce: {"*"}}}
		if err := auth.PutEntry(cfg.Security.TokensFile, ft); err != nil {
			t.Fatal(err)
		}
		keys := filepath.Join(dir, "aws-keys.yaml")
		for _, k := range []struct {
			into  *key
			token string
		}{{&e.admin, "test-admin"}, {&e.producer, "producer"}} {
			id, secret, err := auth.NewAccessKey()
			if err != nil {
				t.Fatal(err)
			}
			*k.into = key{id, secret}
			if err := auth.PutAccessKey(keys, auth.AccessKey{ID: id, Secret: secret, Token: k.token}, false); err != nil {
				t.Fatal(err)
			}
		}
		cfg.Security.AWSCredentialsFile = keys
	}})
	e.url = r.URL
	e.creds = filepath.Join(dir, "aws-credentials")
	ini := "[default]\naws_access_key_id = " + e.admin.id + "\naws_secret_access_key = " + e.admin.secret + "\n" +
		"[producer]\naws_access_key_id = " + e.producer.id + "\naws_secret_access_key = " + e.producer.secret + "\n"
	if err := os.WriteFile(e.creds, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

// client is an SDK client of the router signing with k.
func (e *env) client(k key) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(e.url),
		Credentials:  credentials.NewStaticCredentialsProvider(k.id, k.secret, ""),
	})
}

// ctx is the test's context, bounded by its deadline.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithCancel(context.Background())
	if d, ok := t.Deadline(); ok {
		c, cancel = context.WithDeadline(context.Background(), d.Add(-5*time.Second))
	}
	t.Cleanup(cancel)
	return c
}

// code is the error code an SDK caller sees (the query protocol's, which
// the JSON protocol carries in X-Amzn-Query-Error).
func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// must(call())(t) is call's value, failing t on its error.
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}
