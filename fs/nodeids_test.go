package fs

import "testing"

// TestKnownNodeIDsAreTheOnesGiven: SOURCE's inodes are known as their
// own numbers; another device's inode only once of numbered it, as
// of did, and asking hands out none.
func TestKnownNodeIDsAreTheOnesGiven(t *testing.T) {
	ids := nodeIDs{srcDev: 7}
	if id, ok := ids.known(7, 42); !ok || id != 42 {
		t.Fatalf("SOURCE's inode 42: known %d, %v; want 42, true", id, ok)
	}
	if id, ok := ids.known(8, 42); ok {
		t.Fatalf("another device's inode not numbered yet: known %d, true; want false", id)
	}
	if id, ok := ids.known(7, foreignBase+1); ok {
		t.Fatalf("a SOURCE inode number in the table's range not numbered yet: known %d, true; want false", id)
	}
	if len(ids.foreign) != 0 {
		t.Fatalf("known numbered %d inodes; want none", len(ids.foreign))
	}
	want := ids.of(8, 42)
	if id, ok := ids.known(8, 42); !ok || id != want {
		t.Fatalf("another device's inode numbered %d: known %d, %v", want, id, ok)
	}
}
