// Command leasecheck is the integration tests' Go lease consumer (and the
// GPU tier's: it builds with CGO_ENABLED=0). It leases each PATH through
// client.Open (or client.OpenMany with -many), prints one JSON line per
// file with the SHA-256 of the bytes it reads through the mapping, and
// with -hold keeps the leases until stdin closes.
//
//	-write      write one byte through the first lease's mapping: a shared
//	            lease faults there (exit 7, "faulted"; any other panic
//	            exits 8); a private one does not ("written", once the
//	            byte reads back changed)
//	-hold       keep the leases until stdin closes; each line "sum" read
//	            meanwhile prints the JSON lines again, read anew through
//	            the mappings, then "held"
//	-cycles N   lease and close the PATHs N times in turn; print this
//	            process's descriptors and mappings of gdsfs before and after
//	-change F   with -cycles: rewrite SOURCE file F every 100 cycles
//	-nofile N   lower RLIMIT_NOFILE to N descriptors beyond those open, so
//	            an answer's descriptors are truncated (MSG_CTRUNC)
//	-bench N    per PATH: the first lease's time, then the median and 90th
//	            percentile of N repeat leases (Open to a pointer, Close), ms
//	-devices L  lease each PATH on each device of the comma-separated list
//	            (client.OnDevice: GPU-<uuid>, hostN, an ordinal), in this one
//	            process; "asked" in the output is the device asked for (by
//	            default the client's DefaultDevice)
//
// A failed lease prints "ERRNO path: message" on stderr and exits 3
// (with -hold it waits for stdin first).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
)

type result struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	Device     string `json:"device"`
	Generation uint64 `json:"generation"`
	ReadOnly   bool   `json:"readonly"`
	Reused     bool   `json:"reused"`
	Asked      string `json:"asked"` // the device the lease asked for ("": none)
}

func main() {
	hold := flag.Bool("hold", false, "keep the leases until stdin closes")
	many := flag.Bool("many", false, "lease every PATH in one client.OpenMany")
	write := flag.Bool("write", false, "write a byte through the first lease's mapping")
	cycles := flag.Int("cycles", 0, "lease and close the PATHs this many times; print descriptor and mapping counts")
	change := flag.String("change", "", "with -cycles: a SOURCE file to rewrite every 100 cycles")
	nofile := flag.Int("nofile", -1, "leave only this many free descriptors (RLIMIT_NOFILE)")
	bench := flag.Int("bench", 0, "time this many repeat leases of each PATH")
	devices := flag.String("devices", "", "lease each PATH on each of these devices (comma separated)")
	flag.Parse()
	if *bench > 0 {
		runBench(flag.Args(), *bench)
		return
	}
	if *cycles > 0 {
		runCycles(flag.Args(), *cycles, *change)
		return
	}
	if *nofile >= 0 {
		limitFDs(*nofile)
	}
	if *many && strings.Contains(*devices, ",") {
		fmt.Fprintln(os.Stderr, "-many leases on one device: give -devices one")
		os.Exit(2)
	}
	reqs := requests(flag.Args(), *devices)
	leases, err := open(reqs, *many)
	if err != nil {
		var errno syscall.Errno
		name := "EIO"
		if errors.As(err, &errno) {
			name = unix.ErrnoName(errno)
		}
		fmt.Fprintf(os.Stderr, "%s %v\n", name, err)
		if *hold {
			fmt.Println("failed", name)
			io.Copy(io.Discard, os.Stdin)
		}
		os.Exit(3)
	}
	report(reqs, leases)
	if *write && len(leases) > 0 {
		writeThrough(leases[0])
	}
	if *hold {
		fmt.Println("held")
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() != "sum" {
				continue
			}
			report(reqs, leases)
			fmt.Println("held")
		}
		io.Copy(io.Discard, os.Stdin) // after a line too long (stdin /dev/zero): hold until EOF all the same
	}
	for _, l := range leases {
		if err := l.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "close: %v\n", err)
			os.Exit(5)
		}
	}
}

// report prints one JSON line per lease, its bytes read through the
// mapping now.
func report(reqs []request, leases []*client.Lease) {
	for i, l := range leases {
		r := result{reqs[i].path, l.Size(), sum(l), l.Device(), l.Generation(), l.ReadOnly(), l.Reused(), reqs[i].device}
		json.NewEncoder(os.Stdout).Encode(r)
	}
}

// request is one lease to make: a path on a device.
type request struct{ path, device string }

// requests is each path on each device of the list (none: the client's
// default device).
func requests(paths []string, devices string) []request {
	devs := []string{client.DefaultDevice()}
	if devices != "" {
		devs = strings.Split(devices, ",")
	}
	var out []request
	for _, d := range devs {
		for _, p := range paths {
			out = append(out, request{p, d})
		}
	}
	return out
}

func open(reqs []request, many bool) ([]*client.Lease, error) {
	if many {
		var paths []string
		for _, r := range reqs {
			paths = append(paths, r.path)
		}
		return client.OpenMany(paths, client.OnDevice(reqs[0].device))
	}
	var out []*client.Lease
	for _, r := range reqs {
		l, err := client.Open(r.path, client.OnDevice(r.device))
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func sum(l *client.Lease) string {
	h := sha256.New()
	buf := make([]byte, 8<<20)
	for off := int64(0); off < l.Size(); off += int64(len(buf)) {
		n := min(int64(len(buf)), l.Size()-off)
		if _, err := l.ReadAt(buf[:n], off); err != nil {
			fmt.Fprintf(os.Stderr, "read at %d: %v\n", off, err)
			os.Exit(4)
		}
		h.Write(buf[:n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// writeThrough flips the first byte of a host lease through its mapping.
// Only a fault at that byte (SIGSEGV or SIGBUS there, which
// SetPanicOnFault turns into a panic carrying the address) is the
// expected one; any other panic is not.
func writeThrough(l *client.Lease) {
	if !strings.HasPrefix(l.Device(), "host") {
		fmt.Fprintln(os.Stderr, "-write needs a host lease (GPU leases: see scripts/lease-gpu.sh)")
		os.Exit(2)
	}
	addr := uintptr(l.Ptr())
	debug.SetPanicOnFault(true)
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok && f.Addr() == addr && addr != 0 {
			fmt.Println("faulted")
			fmt.Fprintf(os.Stderr, "%v (at %#x, the lease's first byte)\n", r, addr)
			os.Exit(7)
		}
		fmt.Fprintf(os.Stderr, "a panic other than a fault at the lease's first byte %#x: %v\n", addr, r)
		os.Exit(8)
	}()
	p := (*byte)(unsafe.Add(unsafe.Pointer(nil), addr))
	was := *p
	*p = ^was
	b := make([]byte, 1)
	if _, err := l.ReadAt(b, 0); err != nil || b[0] != ^was {
		fmt.Fprintf(os.Stderr, "the write did not take: the first byte reads %#x (%v), want %#x\n", b[0], err, ^was)
		os.Exit(9)
	}
	fmt.Println("written")
}

// limitFDs fills the free descriptor numbers below the highest open one
// (the kernel hands out the lowest free number) and sets RLIMIT_NOFILE so
// exactly free more can be opened.
func limitFDs(free int) {
	if _, _, err := os.Pipe(); err != nil { // start the poller (epoll, eventfd) now
		fmt.Fprintln(os.Stderr, "pipe:", err)
		os.Exit(2)
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	highest := 0
	for _, e := range ents {
		var n int
		fmt.Sscan(e.Name(), &n)
		highest = max(highest, n)
	}
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "open /dev/null:", err)
			os.Exit(2)
		}
		if fd > highest {
			unix.Close(fd)
			break
		}
	}
	lim := &unix.Rlimit{Cur: uint64(highest + 1 + free), Max: uint64(highest + 1 + free)}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, lim); err != nil {
		fmt.Fprintln(os.Stderr, "setrlimit:", err)
		os.Exit(2)
	}
}

// counts are this process's descriptors and mappings.
type counts struct {
	FDs       int `json:"fds"`
	MemFDs    int `json:"memfds"`
	Sockets   int `json:"sockets"`
	MemfdMaps int `json:"memfd_maps"`
	MapsTotal int `json:"maps"`
}

func count() counts {
	var c counts
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the directory's own descriptor, closed meanwhile
		}
		c.FDs++
		switch {
		case strings.HasPrefix(link, "/memfd:"):
			c.MemFDs++
		case strings.HasPrefix(link, "socket:"):
			c.Sockets++
		}
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	for _, l := range strings.Split(string(maps), "\n") {
		if l == "" {
			continue
		}
		c.MapsTotal++
		if strings.Contains(l, "/memfd:") {
			c.MemfdMaps++
		}
	}
	return c
}

func runCycles(paths []string, n int, change string) {
	cycle := func(i int) {
		if change != "" && i%100 == 99 {
			b, _ := os.ReadFile(change)
			if len(b) > 0 {
				b[i%len(b)]++
			}
			os.WriteFile(change, b, 0o644)
			st, _ := os.Stat(change)
			t := st.ModTime().Add(1e9)
			os.Chtimes(change, t, t)
		}
		l, err := client.Open(paths[i%len(paths)])
		if err != nil {
			fmt.Fprintf(os.Stderr, "cycle %d: %v\n", i, err)
			os.Exit(3)
		}
		b := make([]byte, 1)
		if _, err := l.ReadAt(b, 0); err != nil && err != io.EOF {
			fmt.Fprintf(os.Stderr, "cycle %d: read: %v\n", i, err)
			os.Exit(4)
		}
		if err := l.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "cycle %d: close: %v\n", i, err)
			os.Exit(5)
		}
	}
	for i := range len(paths) {
		cycle(i) // the first lease of each file, outside the count
	}
	client.DropCache()
	before := count()
	for i := 0; i < n; i++ {
		cycle(i)
	}
	client.DropCache()
	after := count()
	json.NewEncoder(os.Stdout).Encode(map[string]counts{"before": before, "after": after})
}

// runBench times leases: the first of each file in this process, then n
// repeat leases (the kept mapping, one round trip).
func runBench(paths []string, n int) {
	for _, p := range paths {
		start := time.Now()
		l, err := client.Open(p)
		if err != nil || l.Ptr() == 0 {
			fmt.Fprintf(os.Stderr, "%s: %v\n", p, err)
			os.Exit(3)
		}
		first := time.Since(start)
		l.Close()
		times := make([]float64, 0, n)
		reused := 0
		for range n {
			start := time.Now()
			l, err := client.Open(p)
			if err != nil || l.Ptr() == 0 {
				fmt.Fprintf(os.Stderr, "%s: %v\n", p, err)
				os.Exit(3)
			}
			times = append(times, float64(time.Since(start).Nanoseconds())/1e6)
			if l.Reused() {
				reused++
			}
			l.Close()
		}
		sort.Float64s(times)
		json.NewEncoder(os.Stdout).Encode(map[string]any{
			"path": p, "first_ms": float64(first.Nanoseconds()) / 1e6, "repeat_median_ms": times[n/2],
			"repeat_p90_ms": times[n*9/10], "reused": reused, "runs": n,
		})
	}
}
