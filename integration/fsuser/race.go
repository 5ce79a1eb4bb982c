package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// race SRC MNT N: as the owner of SRC/u, swap SRC/u/f with SRC/u/alt (a
// symbolic link to a file outside SOURCE) and SRC/u/d with SRC/u/dalt (a
// link to a directory outside SOURCE, which holds a file x as SRC/u/d
// does) with RENAME_EXCHANGE as fast as it can, while making each kind of
// change N times through the mount, on MNT/u/f, on MNT/u/d/x or inside
// MNT/u/d: the kernel checks the entries it looked up, and the swap lands
// between that lookup and the daemon's call. It prints one line per kind
// of change: its name, successes and failures.
func race(args []string) error {
	if len(args) != 3 {
		return errors.New("race SRC MNT N")
	}
	src, mnt := filepath.Join(args[0], "u"), filepath.Join(args[1], "u")
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	uid, gid := os.Getuid(), os.Getgid()
	f, d := filepath.Join(mnt, "f"), filepath.Join(mnt, "d")
	at := func(i int, prefix string) string { return filepath.Join(d, prefix+strconv.Itoa(i)) }
	kinds := []struct {
		name string
		pair string // the entry of SRC/u swapped
		do   func(i int) error
	}{
		{"chmod", "f", func(int) error { return unix.Chmod(f, 0o666) }},
		{"truncate", "f", func(int) error { return unix.Truncate(f, 0) }},
		{"chown", "f", func(int) error { return unix.Chown(f, uid, gid) }},
		{"utimes", "f", func(int) error {
			t := unix.Timespec{Sec: 1_000_000_000}
			return unix.UtimesNanoAt(unix.AT_FDCWD, f, []unix.Timespec{t, t}, 0)
		}},
		{"setxattr", "f", func(int) error { return unix.Setxattr(f, "user.race", []byte("x"), 0) }},
		{"chmod-below", "d", func(int) error { return unix.Chmod(filepath.Join(d, "x"), 0o666) }},
		{"truncate-below", "d", func(int) error { return unix.Truncate(filepath.Join(d, "x"), 0) }},
		{"create", "d", func(i int) error {
			fd, err := unix.Open(at(i, "c"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"mkdir", "d", func(i int) error { return unix.Mkdir(at(i, "m"), 0o755) }},
		{"symlink", "d", func(i int) error { return unix.Symlink("x", at(i, "s")) }},
		{"mknod", "d", func(i int) error { return unix.Mkfifo(at(i, "p"), 0o644) }},
		{"link", "d", func(i int) error { return unix.Link(filepath.Join(mnt, "g"), at(i, "l")) }},
		{"rename", "d", func(i int) error {
			tmp := filepath.Join(mnt, "r"+strconv.Itoa(i))
			fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			unix.Close(fd)
			return unix.Rename(tmp, at(i, "r"))
		}},
	}
	for _, k := range kinds {
		ok, failed, err := raceOne(src, k.pair, n, k.do)
		if err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
		fmt.Println(k.name, ok, failed)
	}
	return nil
}

// raceOne runs do n times while another goroutine swaps SRC/u/pair with
// SRC/u/pair's alternative, and leaves the pair as it found it.
func raceOne(src, pair string, n int, do func(i int) error) (ok, failed int, err error) {
	real, alt := filepath.Join(src, pair), filepath.Join(src, pair+"alt")
	if pair == "f" {
		alt = filepath.Join(src, "alt")
	}
	swap := func() error { return unix.Renameat2(unix.AT_FDCWD, real, unix.AT_FDCWD, alt, unix.RENAME_EXCHANGE) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var swapErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if swapErr = swap(); swapErr != nil {
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		if do(i) == nil {
			ok++
		} else {
			failed++
		}
	}
	close(stop)
	wg.Wait()
	if swapErr != nil {
		return ok, failed, swapErr
	}
	var st unix.Stat_t
	if err := unix.Lstat(real, &st); err != nil {
		return ok, failed, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return ok, failed, swap() // put the real entry back under its name
	}
	return ok, failed, nil
}
