package fs

import (
	"context"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/gdsfs/gdsfs/staging/watch"
)

type journalRoot struct{ gofs.Inode }

// TestJournalNamesTheNodesHeld: the journal read back names the nodes
// added and not dropped, with their ids and FIDs, and the highest handle
// number noted; a freed slot is reused.
func TestJournalNamesTheNodesHeld(t *testing.T) {
	root := &journalRoot{}
	gofs.NewNodeFS(root, &gofs.Options{})
	ctx := context.Background()
	node := func(ino uint64, mode uint32) *gofs.Inode {
		return root.NewPersistentInode(ctx, &gofs.Inode{}, gofs.StableAttr{Ino: ino, Mode: mode})
	}
	j, err := newJournal()
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	a, b, c := node(10, syscall.S_IFREG), node(11, syscall.S_IFDIR), node(12, syscall.S_IFREG)
	for n, fid := range map[*gofs.Inode]watch.FID{a: "fid-a", b: "fid-b", c: "fid-c"} {
		if !j.add(n, fid) {
			t.Fatal("no slot for a node in an empty journal")
		}
	}
	j.add(a, "fid-a") // a node is journaled once
	j.drop(b)
	d := node(13, syscall.S_IFREG)
	j.add(d, "fid-d")
	if j.next != 4 {
		t.Errorf("slots handed out: %d, want 4 (the header and 3: the dropped node's slot reused)", j.next)
	}
	j.noteHandle(7)
	j.noteHandle(3)
	recs, fh, err := readJournal(j.f)
	if err != nil {
		t.Fatal(err)
	}
	if fh != 7 {
		t.Errorf("highest handle number read back %d, want 7", fh)
	}
	got := map[uint64]journalRecord{}
	for _, r := range recs {
		got[r.id] = r
	}
	want := map[uint64]journalRecord{10: {10, "fid-a"}, 12: {12, "fid-c"}, 13: {13, "fid-d"}}
	if len(recs) != len(want) {
		t.Fatalf("journal names %d nodes (%v), want %v", len(recs), recs, want)
	}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("node %d: %+v, want %+v", id, got[id], w)
		}
	}
	if _, _, err := readJournal(mustMemfd(t)); err == nil {
		t.Error("an empty memfd read as a journal")
	}
}

func mustMemfd(t *testing.T) *os.File {
	fd, err := unix.MemfdCreate("not-a-journal", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "not-a-journal")
	t.Cleanup(func() { f.Close() })
	return f
}
