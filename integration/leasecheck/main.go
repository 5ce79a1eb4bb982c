// Command leasecheck is the integration tests' Go lease consumer: it leases
// each PATH through client.Open, prints one JSON line per file with the
// SHA-256 of the bytes it reads through the mapping, and with --hold keeps
// the leases until killed or stdin closes.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/client"
)

type result struct {
	Path       string `json:"path"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	Device     string `json:"device"`
	Generation uint64 `json:"generation"`
}

func main() {
	hold := flag.Bool("hold", false, "keep the leases until stdin closes")
	flag.Parse()
	var leases []*client.Lease
	for _, p := range flag.Args() {
		l, err := client.Open(p)
		if err != nil {
			var errno syscall.Errno
			name := "EIO"
			if errors.As(err, &errno) {
				name = unix.ErrnoName(errno)
			}
			fmt.Fprintf(os.Stderr, "%s %s: %v\n", name, p, err)
			os.Exit(3)
		}
		leases = append(leases, l)
		h := sha256.New()
		buf := make([]byte, 8<<20)
		for off := int64(0); off < l.Size(); off += int64(len(buf)) {
			n := min(int64(len(buf)), l.Size()-off)
			if _, err := l.ReadAt(buf[:n], off); err != nil {
				fmt.Fprintf(os.Stderr, "read %s at %d: %v\n", p, off, err)
				os.Exit(4)
			}
			h.Write(buf[:n])
		}
		json.NewEncoder(os.Stdout).Encode(result{p, l.Size(), hex.EncodeToString(h.Sum(nil)), l.Device(), l.Generation()})
	}
	if *hold {
		fmt.Println("held")
		io.Copy(io.Discard, os.Stdin)
	}
	for _, l := range leases {
		if err := l.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "close: %v\n", err)
			os.Exit(5)
		}
	}
}
