package ctl

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardmq/shardmq/auth"
)

// DefaultTokenFile is where `make run` writes the sandbox's admin token.
const DefaultTokenFile = "var/router.token"

// ResolveToken picks the API token: the -token flag, else $SHARDMQ_TOKEN,
// else the first line of file (DefaultTokenFile when file is empty and it
// exists). "" means none: fine for a router without a token file.
func ResolveToken(flagToken, file string) (string, error) {
	return resolveToken(flagToken, file, os.Getenv, "")
}

// resolveToken is ResolveToken reading the environment through getenv
// and DefaultTokenFile under dir ("" is the working directory).
func resolveToken(flagToken, file string, getenv func(string) string, dir string) (string, error) {
	if flagToken != "" {
		return flagToken, nil
	}
	if v := getenv("SHARDMQ_TOKEN"); v != "" {
		return strings.TrimSpace(v), nil
	}
	explicit := file != ""
	if !explicit {
		file = filepath.Join(dir, DefaultTokenFile)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		if !explicit && errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("token file: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	return strings.TrimSpace(line), nil
}

// WithToken returns a client whose requests carry Authorization: Bearer
// token (client itself when token is empty).
func WithToken(client *http.Client, token string) *http.Client {
	if client == nil {
		client = &http.Client{Timeout: 60 * time.Second}
	}
	if token == "" {
		return client
	}
	c := *client
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = bearer{base: base, token: token}
	return &c
}

type bearer struct {
	base  http.RoundTripper
	token string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

const tokenUsage = `usage: shardmqctl token new -name NAME [-produce PATTERNS] [-consume PATTERNS] [-admin PATTERNS]
                          [-rate N -burst N] [-tokens FILE] [-out FILE]

Makes a new API token. Its SHA-256 hash, name and scopes go into the router's
token file (-tokens; an entry of the same name is replaced, so this also
rotates a token; the router picks the change up within a second). The secret
goes to -out (created with mode 0600) or, without -out, to standard output:
it is shown once and stored nowhere else. PATTERNS are comma-separated topic
patterns where * stands for any characters ("orders.*", "*").
`

// RunToken is the `token` command; it returns the exit code.
func RunToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "new" {
		fmt.Fprint(stderr, tokenUsage)
		return 2
	}
	fs := newFlags("token new")
	name := fs.String("name", "", "the token's name (logs, metrics, the trace's consumer)")
	produce := fs.String("produce", "", "topic patterns with the produce scope")
	consume := fs.String("consume", "", "topic patterns with the consume scope")
	admin := fs.String("admin", "", "topic patterns with the admin scope (\"*\" for the operations endpoints)")
	perSecond := fs.Float64("rate", 0, "requests per second (0: unlimited)")
	burst := fs.Int("burst", 0, "requests at once above the rate (default: the rate)")
	tokens := fs.String("tokens", "", "the router's token file to add the hash to")
	out := fs.String("out", "", "write the secret to this file (mode 0600) instead of standard output")
	if err := fs.Parse(args[1:]); err != nil {
		fmt.Fprintf(stderr, "shardmqctl: %v\n\n%s", err, tokenUsage)
		return 2
	}
	ft := auth.FileToken{Name: *name, Scopes: map[auth.Scope][]string{}}
	for sc, v := range map[auth.Scope]string{auth.Produce: *produce, auth.Consume: *consume, auth.Admin: *admin} {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				ft.Scopes[sc] = append(ft.Scopes[sc], p)
			}
		}
	}
	if *perSecond > 0 {
		ft.Rate = &auth.Rate{PerSecond: *perSecond, Burst: *burst}
	}
	secret, err := auth.NewToken()
	if err != nil {
		fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
		return 1
	}
	ft.SHA256 = auth.Hash(secret)
	if _, err := (auth.File{Tokens: []auth.FileToken{ft}}).Build("token"); err != nil {
		fmt.Fprintf(stderr, "shardmqctl: %v\n\n%s", err, tokenUsage)
		return 2
	}
	if *out != "" {
		if err := writeSecret(*out, secret); err != nil {
			fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
			return 1
		}
	}
	if *tokens != "" {
		if err := auth.PutEntry(*tokens, ft); err != nil {
			fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
			return 1
		}
	}
	if *out == "" {
		fmt.Fprintln(stdout, secret)
	}
	if *tokens == "" {
		fmt.Fprintf(stderr, "token file entry:\n  - name: %s\n    sha256: %s\n", ft.Name, ft.SHA256)
	}
	return 0
}

// writeSecret writes the token readable by its owner only.
func writeSecret(path string, secret string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
