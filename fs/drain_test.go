package fs

import (
	"syscall"
	"testing"
)

func closedChan(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Drain refuses new opens and reports idle once the files open before it
// are closed, and at once when none is.
func TestDrain(t *testing.T) {
	var s Server
	if errno := s.drain.admit(); errno != 0 {
		t.Fatalf("admit before Drain: %v", errno)
	}
	s.drain.opened()
	s.drain.opened()
	open, idle := s.Drain()
	if open != 2 || closedChan(idle) {
		t.Fatalf("Drain with 2 open: %d, idle closed %v", open, closedChan(idle))
	}
	if errno := s.drain.admit(); errno != syscall.ESHUTDOWN {
		t.Fatalf("admit after Drain: %v, want ESHUTDOWN", errno)
	}
	s.drain.closed()
	if closedChan(idle) || s.OpenFiles() != 1 {
		t.Fatalf("one of two closed: idle %v, open %d", closedChan(idle), s.OpenFiles())
	}
	s.drain.closed()
	if !closedChan(idle) {
		t.Fatal("idle not closed after the last file closed")
	}
	if _, again := s.Drain(); again != idle {
		t.Fatal("a second Drain returned another channel")
	}
	var fresh Server
	if _, idle := fresh.Drain(); !closedChan(idle) {
		t.Fatal("Drain with nothing open is not idle at once")
	}
}
