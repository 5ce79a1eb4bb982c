package fs

import (
	"sync"
	"syscall"
)

// drain counts the files open through the mount (regular files, the ones
// that keep an unmount busy) so that a stopping daemon can refuse new
// opens and learn when the last one closed.
type drain struct {
	mu       sync.Mutex
	open     int           // guarded by mu; INVARIANT: >= 0
	idle     chan struct{} // guarded by mu; nil until Drain, closed once open == 0 after it
	idleDone bool          // guarded by mu; idle was closed
}

// admit reports whether a new open may proceed: ESHUTDOWN once draining.
func (d *drain) admit() syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.idle != nil {
		return syscall.ESHUTDOWN
	}
	return 0
}

func (d *drain) opened() {
	d.mu.Lock()
	d.open++
	d.mu.Unlock()
}

func (d *drain) closed() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.open--
	d.signalIdleLocked()
}

// signalIdleLocked closes idle once draining and nothing is open.
func (d *drain) signalIdleLocked() {
	if d.idle != nil && d.open == 0 && !d.idleDone {
		close(d.idle)
		d.idleDone = true
	}
}

// Drain makes the mount refuse new opens and creates (ESHUTDOWN) from
// now on; files opened before keep working. It returns how many files are
// open and a channel closed once none is. Calling it again returns the
// same channel.
func (s *Server) Drain() (open int, idle <-chan struct{}) {
	d := &s.drain
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	d.signalIdleLocked()
	return d.open, d.idle
}

// OpenFiles is the number of files open through the mount.
func (s *Server) OpenFiles() int {
	s.drain.mu.Lock()
	defer s.drain.mu.Unlock()
	return s.drain.open
}
