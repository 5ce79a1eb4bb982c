package ipc_test

import (
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

// TestKeptMappingsCannotPassCapacity is issue 7 item 5: a consumer keeps
// its mappings after release and re-acquires a file that keeps changing.
// What it has mapped never passes the capacity (the acquire past it fails
// with ENOSPC saying why), and the stats show what it holds.
func TestKeptMappingsCannotPassCapacity(t *testing.T) {
	const capacity, size = 64 << 20, 8 << 20
	f := start(t, ipc.SharingShared, setup{capacity: capacity, chunk: 4 << 20, opts: func(o *ipc.Options) {
		o.AcquireTimeout = 300 * time.Millisecond
	}})
	for _, sameConn := range []bool{true, false} {
		k := &keeper{t: t}
		var conns []*raw
		refused := 0
		for i := 0; i < 2*capacity/size; i++ {
			f.write(t, "f", pattern(size, i))
			if sameConn && len(conns) == 0 || !sameConn {
				conns = append(conns, dial(t, f.srv.Path()))
			}
			r := conns[len(conns)-1]
			resp, files := r.do(proto.Request{Op: proto.OpAcquire, Path: "f"})
			if !resp.OK {
				if resp.Errno != "ENOSPC" || !strings.Contains(resp.Error, "ipc.acquire_timeout") {
					t.Fatalf("acquire %d: %+v, want ENOSPC saying how long it waited", i, resp)
				}
				refused++
				continue
			}
			fl := make([]fileLike, len(files))
			for j := range files {
				fl[j] = files[j]
			}
			k.keep(resp, fl)
			r.do(proto.Request{Op: proto.OpRelease, Lease: resp.Lease})
			if k.mapped > capacity {
				t.Fatalf("same connection %v: %d MiB mapped with a capacity of %d MiB", sameConn, k.mapped>>20, capacity>>20)
			}
			if st := f.srv.Stats(); st.HeldBytes != k.mapped {
				t.Fatalf("lease_held_bytes %d, the consumer maps %d", st.HeldBytes, k.mapped)
			}
		}
		if refused == 0 {
			t.Fatalf("same connection %v: every acquire succeeded: nothing bounded the consumer", sameConn)
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
