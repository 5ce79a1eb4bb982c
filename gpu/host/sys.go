package host

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
)

// newChunk creates a sealable memfd of n bytes.
func newChunk(name string, n int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if err := unix.Ftruncate(fd, n); err != nil {
		f.Close()
		return nil, fmt.Errorf("ftruncate memfd to %d: %w", n, err)
	}
	return f, nil
}

func mapErr(err error) error {
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: %v", gpu.ErrOutOfMemory, err)
	}
	return err
}

func memInfo() (free, total int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("meminfo: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		v, perr := strconv.ParseInt(fields[1], 10, 64)
		if perr != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			free = v << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("meminfo: no MemTotal line")
	}
	return free, total, s.Err()
}
