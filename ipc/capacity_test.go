package ipc_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/proto"
)

// keeper is a consumer that maps every grant and never unmaps: what it
// holds mapped must never pass the capacity.
type keeper struct {
	t      *testing.T
	maps   [][]byte
	mapped int64
}

func (k *keeper) keep(resp proto.Response, files []fileLike) {
	k.t.Helper()
	for i, f := range files {
		n := resp.Chunks[i].Len
		m, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			k.t.Fatal(err)
		}
		k.maps = append(k.maps, m)
		k.mapped += n
	}
}

func (k *keeper) unmapAll() {
	for _, m := range k.maps {
		unix.Munmap(m)
	}
	k.maps, k.mapped = nil, 0
}

type fileLike interface{ Fd() uintptr }

// TestKeptMappingsCannotPassCapacity: a consumer keeps its mappings after
// release and re-acquires a file that keeps changing. What it has mapped
// never passes the capacity: the acquire that would pass it is the one
// refused, with ENOSPC saying why, and the stats show what it holds.
//
// Each version is staged beforehand (without a deadline) where it fits, so
// ipc.acquire_timeout bounds only the wait for room, which must run out.
func TestKeptMappingsCannotPassCapacity(t *testing.T) {
	const capacity, size = 64 << 20, 8 << 20
	for _, sameConn := range []bool{true, false} {
		f := start(t, ipc.SharingShared, setup{capacity: capacity, chunk: 4 << 20, opts: func(o *ipc.Options) {
			o.AcquireTimeout = time.Second
		}})
		k := &keeper{t: t}
		var conns []*raw
		refused := 0
		for i := 0; refused < 2; i++ {
			f.write(t, "f", pattern(size, i))
			fits := k.mapped+size <= capacity
			if fits {
				if _, err := f.cache.Stage(context.Background(), "f"); err != nil {
					t.Fatalf("staging version %d with %d MiB held: %v", i, k.mapped>>20, err)
				}
			}
			if sameConn && len(conns) == 0 || !sameConn {
				conns = append(conns, dial(t, f.srv.Path()))
			}
			r := conns[len(conns)-1]
			resp, files := r.do(proto.Request{Op: proto.OpAcquire, Path: "f"})
			switch {
			case !fits && resp.OK:
				t.Fatalf("same connection %v: version %d granted with %d MiB mapped and a capacity of %d MiB", sameConn, i, k.mapped>>20, capacity>>20)
			case !fits && (resp.Errno != "ENOSPC" || !strings.Contains(resp.Error, "ipc.acquire_timeout")):
				t.Fatalf("acquire %d: %+v, want ENOSPC saying how long it waited", i, resp)
			case !fits:
				refused++
				continue
			case !resp.OK:
				t.Fatalf("same connection %v: version %d refused with %d MiB mapped: %+v", sameConn, i, k.mapped>>20, resp)
			}
			fl := make([]fileLike, len(files))
			for j := range files {
				fl[j] = files[j]
			}
			k.keep(resp, fl)
			r.do(proto.Request{Op: proto.OpRelease, Lease: resp.Lease})
			if st := f.srv.Stats(); st.HeldBytes != k.mapped {
				t.Fatalf("lease_held_bytes %d, the consumer maps %d", st.HeldBytes, k.mapped)
			}
		}
		if k.mapped != capacity {
			t.Fatalf("same connection %v: %d MiB mapped when refused, want the capacity (%d MiB)", sameConn, k.mapped>>20, capacity>>20)
		}
		k.unmapAll()
		for _, r := range conns {
			r.c.Close()
		}
		f.waitClosed(t, len(conns))
		if st := f.srv.Stats(); st.HeldBytes != 0 {
			t.Fatalf("held after closing: %+v", st)
		}
	}
}
