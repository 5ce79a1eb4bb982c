package client

import (
	"errors"
	"syscall"
	"time"

	"github.com/gdsfs/gdsfs/proto"
)

// Wait asks on c until path's state is one of until (proto.StateAbsent,
// StateResident, StateFailed) and returns the daemon's answer (state,
// load_path, size as stat answers them): at once if it is already, or at
// the first change into one of them. After timeout it is an error with
// ETIMEDOUT. The daemon checks the file as stat does (EACCES for a file
// the caller may not read). Nothing is polled: the daemon answers when
// the state changes.
func (c *Conn) Wait(path string, until []string, timeout time.Duration) (proto.Response, error) {
	deadline := time.Now().Add(timeout)
	for left := timeout; ; left = time.Until(deadline) {
		ms := waitMS(left)
		resp, _, err := c.roundTrip(proto.Request{Op: proto.OpWait, Path: path, Until: until, TimeoutMS: ms})
		if !longer(err, ms, deadline) {
			return resp, err
		}
	}
}

// WaitStat asks on c until the daemon's lease counter key (one of
// proto.WaitStatKeys, e.g. proto.StatLeasesActive) equals value, or
// ETIMEDOUT after timeout. proto.StatOpenConnections leaves out c itself.
func (c *Conn) WaitStat(key string, value int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for left := timeout; ; left = time.Until(deadline) {
		ms := waitMS(left)
		_, _, err := c.roundTrip(proto.Request{Op: proto.OpWaitStat, Key: key, Value: &value, TimeoutMS: ms})
		if !longer(err, ms, deadline) {
			return err
		}
	}
}

// waitMS is a timeout_ms for d: 1 to proto.MaxWaitMS.
func waitMS(d time.Duration) int64 {
	return min(max(d.Milliseconds(), 1), proto.MaxWaitMS)
}

// longer says whether a wait that timed out should be asked again: the
// daemon bounds one wait by proto.MaxWaitMS, the caller's timeout was
// longer.
func longer(err error, ms int64, deadline time.Time) bool {
	return ms == proto.MaxWaitMS && errors.Is(err, syscall.ETIMEDOUT) && time.Until(deadline) > 0
}

// Wait is Conn.Wait on a connection of its own to the daemon holding path
// (closed after).
func Wait(path string, until []string, timeout time.Duration) (proto.Response, error) {
	c, rel, err := DialMount(path)
	if err != nil {
		return proto.Response{}, err
	}
	defer c.Close()
	return c.Wait(rel, until, timeout)
}

// WaitStat is Conn.WaitStat on a connection of its own to the daemon
// holding path (any path under its mount, e.g. a file or
// MOUNT/.gdsfs/socket).
func WaitStat(path, key string, value int64, timeout time.Duration) error {
	c, _, err := DialMount(path)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.WaitStat(key, value, timeout)
}
