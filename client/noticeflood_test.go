package client

import (
	"testing"

	"github.com/gdsfs/gdsfs/proto"
)

// TestManyReleasesWithoutARequest: releases sent with no request between
// them have their answers read as they go, so the daemon never blocks
// writing answers (and stops reading) and the connection stays up: a
// process ending thousands of leases at once keeps the others.
func TestManyReleasesWithoutARequest(t *testing.T) {
	f := newScripted(t, func(n int, req proto.Request) reply { return okAnswer() })
	c, err := Dial(f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		for range f.got {
		}
	}()
	for i := 1; i <= 5000; i++ {
		c.release(uint64(i), 7)
		if c.broken() {
			t.Fatalf("the connection failed at release %d", i)
		}
	}
	if _, err := c.Stat("x"); err != nil {
		t.Fatalf("a request after the releases: %v", err)
	}
}
