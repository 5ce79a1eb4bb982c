package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// hold PATH MAX: open PATH for reading up to MAX times, stopping at the
// first failure, then try three opens more; print "HELD N ERRNO" (ERRNO:
// the first failure's name, or OK when all MAX opens succeeded) and the
// three later results; keep the descriptors open until stdin closes.
func hold(args []string) error {
	if len(args) != 2 {
		return errors.New("hold PATH MAX")
	}
	most, err := strconv.Atoi(args[1])
	if err != nil {
		return err
	}
	var fds []int
	first := "OK"
	for len(fds) < most {
		fd, err := unix.Open(args[0], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			first = errnoName(err)
			break
		}
		fds = append(fds, fd)
	}
	out := fmt.Sprintf("HELD %d %s", len(fds), first)
	if first != "OK" {
		for range 3 {
			fd, err := unix.Open(args[0], unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				out += " " + errnoName(err)
				continue
			}
			fds = append(fds, fd)
			out += " OK"
		}
	}
	fmt.Println(out)
	io.Copy(io.Discard, os.Stdin)
	for _, fd := range fds {
		unix.Close(fd)
	}
	return nil
}

func errnoName(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}
