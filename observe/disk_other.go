//go:build !(linux || darwin || freebsd)

package observe

import "errors"

func diskSpace(string) (free, size uint64, err error) {
	return 0, 0, errors.New("disk space is read on Linux, macOS and FreeBSD only")
}
