// Command fsuser is the integration tests' unprivileged actor: the tests
// start it as another user (uid 65534) and it makes one system call, or
// runs the symbolic-link swap race, and prints what happened.
//
//	fsuser [-umask 022] OP ARGS...   one call; prints OK, an errno name
//	                                 (EACCES), or OK and a value
//	fsuser race SRC MNT N           the swap race (race.go)
//	fsuser hold PATH MAX            open PATH until refused (hold.go)
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	umask := flag.String("umask", "", "umask to set first (octal)")
	flag.Parse()
	if *umask != "" {
		m, err := strconv.ParseUint(*umask, 8, 32)
		if err != nil {
			fail(err)
		}
		syscall.Umask(int(m))
	}
	args := flag.Args()
	if len(args) == 0 {
		fail(errors.New("want an op and its arguments"))
	}
	if args[0] == "race" {
		if err := race(args[1:]); err != nil {
			fail(err)
		}
		return
	}
	if args[0] == "hold" {
		if err := hold(args[1:]); err != nil {
			fail(err)
		}
		return
	}
	op, ok := ops[args[0]]
	if !ok || len(args)-1 != op.args {
		fail(fmt.Errorf("unknown op or wrong argument count: %q", args))
	}
	v, err := op.do(args[1:])
	var errno syscall.Errno
	switch {
	case err == nil && v != "":
		fmt.Println("OK", v)
	case err == nil:
		fmt.Println("OK")
	case errors.As(err, &errno):
		fmt.Println(unix.ErrnoName(errno))
	default:
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fsuser:", err)
	os.Exit(2)
}

func octal(s string) uint32 {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		fail(err)
	}
	return uint32(v)
}

func num(s string) int {
	v, err := strconv.Atoi(s)
	if err != nil {
		fail(err)
	}
	return v
}

type op struct {
	args int
	do   func(a []string) (string, error)
}

// ops are the calls the conformance table makes, by name.
var ops = map[string]op{
	"create": {2, func(a []string) (string, error) { // PATH MODE: O_CREAT|O_EXCL
		fd, err := unix.Open(a[0], unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, octal(a[1]))
		if err == nil {
			unix.Close(fd)
		}
		return "", err
	}},
	"mkdir":  {2, func(a []string) (string, error) { return "", unix.Mkdir(a[0], octal(a[1])) }},
	"mkfifo": {2, func(a []string) (string, error) { return "", unix.Mkfifo(a[0], octal(a[1])) }},
	"chmod":  {2, func(a []string) (string, error) { return "", unix.Chmod(a[0], octal(a[1])) }},
	"chown": {3, func(a []string) (string, error) { // PATH UID GID (-1 keeps)
		return "", unix.Chown(a[0], num(a[1]), num(a[2]))
	}},
	"lchown": {3, func(a []string) (string, error) { return "", unix.Lchown(a[0], num(a[1]), num(a[2])) }},
	"truncate": {2, func(a []string) (string, error) {
		return "", unix.Truncate(a[0], int64(num(a[1])))
	}},
	"ftruncate": {2, func(a []string) (string, error) { // opens for writing first
		fd, err := unix.Open(a[0], unix.O_WRONLY, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		return "", unix.Ftruncate(fd, int64(num(a[1])))
	}},
	"utimes": {2, func(a []string) (string, error) { // PATH SECONDS
		t := unix.NsecToTimespec(int64(num(a[1])) * 1e9)
		return "", unix.UtimesNanoAt(unix.AT_FDCWD, a[0], []unix.Timespec{t, t}, 0)
	}},
	"touch": {1, func(a []string) (string, error) { // both times to now
		return "", unix.UtimesNanoAt(unix.AT_FDCWD, a[0], nil, 0)
	}},
	"read": {1, func(a []string) (string, error) {
		b, err := os.ReadFile(a[0])
		if err != nil {
			return "", unwrap(err)
		}
		return strconv.Quote(string(b)), nil
	}},
	"write": {2, func(a []string) (string, error) { // PATH TEXT, appended
		fd, err := unix.Open(a[0], unix.O_WRONLY|unix.O_APPEND, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte(a[1]))
		return "", err
	}},
	"unlink":  {1, func(a []string) (string, error) { return "", unix.Unlink(a[0]) }},
	"rmdir":   {1, func(a []string) (string, error) { return "", unix.Rmdir(a[0]) }},
	"rename":  {2, func(a []string) (string, error) { return "", unix.Rename(a[0], a[1]) }},
	"link":    {2, func(a []string) (string, error) { return "", unix.Link(a[0], a[1]) }},
	"symlink": {2, func(a []string) (string, error) { return "", unix.Symlink(a[0], a[1]) }},
	"readdir": {1, func(a []string) (string, error) {
		es, err := os.ReadDir(a[0])
		return strconv.Itoa(len(es)), unwrap(err)
	}},
	"access": {2, func(a []string) (string, error) { return "", unix.Access(a[0], octal(a[1])) }},
	"setxattr": {3, func(a []string) (string, error) {
		return "", unix.Setxattr(a[0], a[1], []byte(a[2]), 0)
	}},
	"getxattr": {2, func(a []string) (string, error) {
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(a[0], a[1], buf)
		if err != nil {
			return "", err
		}
		return strconv.Quote(string(buf[:n])), nil
	}},
}

func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
