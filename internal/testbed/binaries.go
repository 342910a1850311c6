package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// binaries are the MariaDB programs the test bed runs.
type binaries struct {
	mariadbd  string // the server
	installDB string // initialises a data directory
	admin     string // mariadb-admin: shuts down a server known only by its socket
}

// sbinDirs are searched after PATH, which often lacks the sbin directories
// where Debian installs mariadbd.
var sbinDirs = []string{"/usr/sbin", "/usr/local/sbin", "/sbin"}

// findBinaries locates every program up front, so a machine without MariaDB
// fails with one clear message instead of a half-started bed.
func findBinaries() (binaries, error) {
	var (
		b       binaries
		missing []string
	)
	for _, want := range []struct {
		name string
		dst  *string
	}{
		{"mariadbd", &b.mariadbd},
		{"mariadb-install-db", &b.installDB},
		{"mariadb-admin", &b.admin},
	} {
		path, err := lookPath(want.name)
		if err != nil {
			missing = append(missing, want.name)
			continue
		}
		*want.dst = path
	}
	if len(missing) > 0 {
		return binaries{}, fmt.Errorf("testbed: MariaDB program(s) %q not found in PATH or %v; install them with `apt-get install -y mariadb-server` (MariaDB ≥ 10.11)", missing, sbinDirs)
	}
	return b, nil
}

func lookPath(name string) (string, error) {
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	for _, dir := range sbinDirs {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", errors.New(name + " not found")
}
