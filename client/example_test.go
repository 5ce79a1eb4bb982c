package client_test

import (
	"fmt"
	"log"
	"path/filepath"
	"time"

	"github.com/gdsfs/gdsfs/client"
)

// Lease a staged file and read its bytes where they are staged (here host
// memory; on a GPU mount, Ptr is a device pointer to hand to a kernel).
func ExampleOpen() {
	mnt := demoMount() // a gdsfs mount whose source holds hello.txt

	l, err := client.Open(filepath.Join(mnt, "hello.txt"))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	buf := make([]byte, l.Size())
	if _, err := l.ReadAt(buf, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q on %s, %d bytes, read-only %v, mapped %v\n", buf, l.Device(), l.Size(), l.ReadOnly(), l.Ptr() != 0)
	// Output: "hello from gdsfs\n" on host, 17 bytes, read-only true, mapped true
}

// Lease several files in one round trip: the daemon stages them all and
// holds them until each lease is closed.
func ExampleOpenMany() {
	mnt := demoMount()

	paths := []string{
		filepath.Join(mnt, "shards/shard-0.bin"),
		filepath.Join(mnt, "shards/shard-1.bin"),
		filepath.Join(mnt, "shards/shard-2.bin"),
	}
	leases, err := client.OpenMany(paths)
	if err != nil {
		log.Fatal(err)
	}
	for i, l := range leases {
		last := make([]byte, 1)
		if _, err := l.ReadAt(last, l.Size()-1); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("shard-%d.bin: %d MiB of %d\n", i, l.Size()>>20, last[0])
		l.Close()
	}
	// Output:
	// shard-0.bin: 1 MiB of 0
	// shard-1.bin: 2 MiB of 1
	// shard-2.bin: 3 MiB of 2
}

// Wait until the daemon says a file is staged: it answers when the state
// changes, nothing polls.
func ExampleWait() {
	mnt := demoMount()
	path := filepath.Join(mnt, "shards/shard-1.bin")

	l, err := client.Open(path) // stages the file, if it was not
	if err != nil {
		log.Fatal(err)
	}
	l.Close() // the staged copy stays until it is evicted or changes
	resp, err := client.Wait(path, []string{"resident", "failed"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.State, resp.Size)
	// Output: resident 2097152
}

// Talk to a mount's daemon on one connection: ask what it speaks, then
// lease on that connection (the daemon holds the file until the
// connection closes).
func ExampleDialMount() {
	mnt := demoMount()

	c, rel, err := client.DialMount(filepath.Join(mnt, "hello.txt"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	hello, err := c.Hello()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("protocol", hello.Version, hello.Ops)
	l, err := c.Acquire(rel)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	buf := make([]byte, 5)
	if _, err := l.ReadAt(buf, 0); err != nil {
		log.Fatal(err)
	}
	fmt.Println(rel, string(buf))
	// Output:
	// protocol 1 [acquire acquire_many drop hello release report stat wait wait_stat]
	// hello.txt hello
}
