package testbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
)

// templateVersion changes whenever initTemplate's arguments change, so a
// cached template made with other arguments is not used.
const templateVersion = 2

// template returns a data directory to copy for every instance and a
// function that releases it. It is cached across processes under
// os.UserCacheDir()/shardmq-testbed, keyed by the MariaDB binaries, so only
// the first Start on a machine pays for mariadb-install-db; when the cache
// cannot be used the template is made in scratch (under the bed's Dir) and
// removed after use. Removing the cache directory is always safe.
func template(ctx context.Context, bins binaries, scratch string, log *slog.Logger) (string, func(), error) {
	dir, err := cachedTemplate(ctx, bins)
	if err == nil {
		return dir, func() {}, nil
	}
	log.Debug("template cache unusable; initialising a template for this bed", "err", err)
	os.RemoveAll(scratch)
	release := func() {
		os.RemoveAll(scratch)
		os.Remove(scratch + ".log")
	}
	if err := initTemplate(ctx, bins, scratch); err != nil {
		release()
		return "", nil, err
	}
	return scratch, release, nil
}

func cachedTemplate(ctx context.Context, bins binaries) (string, error) {
	root, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	root = filepath.Join(root, "shardmq-testbed")
	key := fmt.Sprintf("v%d", templateVersion)
	for _, bin := range []string{bins.mariadbd, bins.installDB} {
		fi, err := os.Stat(bin)
		if err != nil {
			return "", err
		}
		key += fmt.Sprintf("|%s|%d|%d", bin, fi.Size(), fi.ModTime().UnixNano())
	}
	dir := filepath.Join(root, fmt.Sprintf("template-%08x", fnv32(key)))
	// A template is complete once it exists: it is renamed into place.
	if _, err := os.Stat(filepath.Join(dir, "mysql")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	build, err := os.MkdirTemp(root, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(build)
	if err := initTemplate(ctx, bins, filepath.Join(build, "data")); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(build, "data"), dir); err != nil {
		// Another process may have renamed its template into place first.
		if _, serr := os.Stat(filepath.Join(dir, "mysql")); serr == nil {
			return dir, nil
		}
		return "", err
	}
	// Templates of other binaries or versions are of no more use.
	old, _ := filepath.Glob(filepath.Join(root, "template-*"))
	for _, o := range old {
		if o != dir {
			os.RemoveAll(o)
		}
	}
	return dir, nil
}

// initTemplate initialises one data directory with mariadb-install-db. Every
// instance gets a copy of it: one install plus copies is faster than one
// install per instance (each install costs about 0.7 s of a 2-core machine's
// CPU), and the install's bootstrap server writes no binary log, so a copy
// carries no GTID state; server_id comes from each server's flags.
func initTemplate(ctx context.Context, bins binaries, dir string) error {
	logPath := dir + ".log"
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() {
		logFile.Close()
		os.Remove(logPath)
	}()
	// The sys schema is half the template's files, and file creation is what
	// copying costs; its views need performance_schema, which is off.
	extra := dir + ".sql"
	if err := os.WriteFile(extra, []byte("DROP DATABASE IF EXISTS sys;\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(extra)
	args := []string{
		"--no-defaults", // must come first; keeps /etc/mysql out
		"--datadir=" + dir,
		"--auth-root-authentication-method=normal", // root@localhost and root@127.0.0.1 with no password
		"--skip-test-db",
		"--skip-name-resolve",
		"--extra-file=" + extra,
	}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	cmd := exec.CommandContext(ctx, bins.installDB, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testbed: %s %v: %w\n%s", bins.installDB, args, err, tail(logPath))
	}
	return nil
}

// copyDataDir copies the template tree src to dst. Runs of zero bytes become
// holes that allocate then backs with blocks, which is cheaper than writing
// the zeros of a fresh 96 MiB redo log.
func copyDataDir(src, dst string) error {
	buf := make([]byte, 1<<20)
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, info.Mode().Perm())
		case info.Mode().IsRegular():
			return copySparse(path, target, info.Mode().Perm(), buf)
		default:
			return fmt.Errorf("testbed: unexpected file %s in template data directory", path)
		}
	})
}

func copySparse(src, dst string, perm fs.FileMode, buf []byte) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	var (
		size   int64
		sparse bool
	)
	for {
		n, rerr := io.ReadFull(in, buf)
		if n > 0 {
			chunk := buf[:n]
			if isZero(chunk) {
				sparse = true
				_, err = out.Seek(int64(n), io.SeekCurrent)
			} else {
				_, err = out.Write(chunk)
			}
			if err != nil {
				out.Close()
				return err
			}
			size += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			out.Close()
			return rerr
		}
	}
	if sparse {
		if err := out.Truncate(size); err != nil {
			out.Close()
			return err
		}
		allocate(out, size)
	}
	return out.Close()
}

var zeros = make([]byte, 1<<20)

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	const tailBytes = 4096
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	off := max(fi.Size()-tailBytes, 0)
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return "(unreadable log: " + err.Error() + ")"
	}
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return "--- tail of " + path + " ---\n" + string(bytes.TrimRight(b, "\n"))
}
