package ctl

import (
	"fmt"
	"io"

	"github.com/shardmq/shardmq/auth"
)

const accessKeyUsage = `usage: shardmqctl aws-key new -token NAME -keys FILE [-out FILE] [-profile NAME] [-replace]

Makes a new access key for the SQS API (docs/sqs.md) acting as the token NAME
of the router's token file: every call signed with it has that token's scopes
and rate. The key id and secret go into the router's access-key file (-keys,
mode 0600, created when missing; the router picks the change up within a
second). With -out they are also written, mode 0600, as an AWS
shared-credentials file whose profile -profile (default "default") SDKs and
the AWS CLI read (AWS_SHARED_CREDENTIALS_FILE); without it they are printed.
-replace removes the token's other keys (rotation).
`

// RunAccessKey is the `aws-key` command; it returns the exit code.
func RunAccessKey(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "new" {
		fmt.Fprint(stderr, accessKeyUsage)
		return 2
	}
	fs := newFlags("aws-key new")
	token := fs.String("token", "", "the name of the token in the token file whose scopes the key carries")
	keys := fs.String("keys", "", "the router's access-key file (its -aws-credentials)")
	out := fs.String("out", "", "write an AWS shared-credentials file here (mode 0600)")
	profile := fs.String("profile", "default", "the profile of -out")
	replace := fs.Bool("replace", false, "remove the token's other keys")
	if err := fs.Parse(args[1:]); err != nil || *token == "" || *keys == "" {
		fmt.Fprint(stderr, accessKeyUsage)
		return 2
	}
	id, secret, err := auth.NewAccessKey()
	if err != nil {
		fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
		return 1
	}
	if err := auth.PutAccessKey(*keys, auth.AccessKey{ID: id, Secret: secret, Token: *token}, *replace); err != nil {
		fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
		return 1
	}
	if *out != "" {
		if err := auth.WriteSharedCredentials(*out, *profile, id, secret); err != nil {
			fmt.Fprintf(stderr, "shardmqctl: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "aws_access_key_id = %s\naws_secret_access_key = %s\n", id, secret)
	return 0
}
