package sdktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestQueryProtocolClients runs testdata/e2e.sh (Debian's AWS CLI) and
// testdata/e2e.py (Debian's boto3), which speak the query protocol,
// against a router over the test bed. `make test-sqs` installs both and
// sets SQS_E2E=require, so that there they cannot be skipped.
func TestQueryProtocolClients(t *testing.T) {
	t.Parallel()
	missing := ""
	if _, err := os.Stat("/usr/bin/aws"); err != nil {
		missing = "/usr/bin/aws (Debian's awscli)"
	} else if err := exec.Command("/usr/bin/python3", "-c", "import boto3").Run(); err != nil {
		missing = "boto3 for /usr/bin/python3 (Debian's python3-boto3)"
	}
	if missing != "" {
		if os.Getenv("SQS_E2E") == "require" {
			t.Fatalf("%s is not installed", missing)
		}
		t.Skipf("%s is not installed (make test-sqs installs it)", missing)
	}
	e := setup(t)
	home := t.TempDir()
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8",
		"SQS_ENDPOINT=" + e.url, "AWS_SHARED_CREDENTIALS_FILE=" + e.creds, "AWS_CONFIG_FILE=" + filepath.Join(home, "none"),
		"AWS_REGION=us-east-1", "AWS_DEFAULT_REGION=us-east-1", "AWS_PAGER=", "AWS_EC2_METADATA_DISABLED=true"}
	for _, script := range [][]string{{"/bin/bash", "testdata/e2e.sh"}, {"/usr/bin/python3", "testdata/e2e.py"}} {
		t.Run(filepath.Base(script[1]), func(t *testing.T) {
			t.Parallel() // their queues have names of their own
			cmd := exec.CommandContext(ctx(t), script[0], script[1])
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", script[1], err, out)
			}
			t.Logf("%s", out)
		})
	}
}
