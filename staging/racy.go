package staging

import (
	"fmt"
	"time"
)

// The racy-timestamp rule, for files on filesystems that raise no change
// events (network and FUSE filesystems, or staging.watch=timestamps).
//
// A write stamps the file's mtime and ctime when it begins, then copies
// its bytes; a load that reads while such a write is still running copies
// a mix of old and new bytes and finds the same stamps at its end. Every
// write that begins after the load's identity was taken stamps a later
// time (unless it began within the timestamp granularity g of the last
// stamp S) and is caught by the identity check at the load's end or at the
// next request. What remains is a write that began no later than S + g and
// is still running. If every write lasts less than D and the clocks of
// this machine and of the file's server agree within staging.racy_window
// minus g and D, such a write has ended by S + staging.racy_window: so a
// load of a file whose stamp is younger than that waits until then before
// reading. A stamp further in the future than the window (a clock ahead,
// or a file touched to a future date) cannot be the stamp of a write
// running now: any write now stamps the present, which the identity check
// sees.

// waitRacy waits until e's file's stamp is staging.racy_window old, when
// e's filesystem raises no change events. Cache.mu must not be held.
func (c *Cache) waitRacy(e *entry) error {
	window := c.opts.RacyWindow
	if e.events || window <= 0 {
		return nil
	}
	stamp := time.Unix(0, max(e.id.mtime, e.id.ctime))
	now := time.Now()
	safe := stamp.Add(window)
	if !now.Before(safe) || stamp.After(now.Add(window)) {
		return nil
	}
	c.stats.racyWaits.Add(1)
	if c.hooks.racyWait != nil {
		c.hooks.racyWait(e.rel)
	}
	t := time.NewTimer(safe.Sub(now))
	defer t.Stop()
	ctx, what := c.ctx, "cache closing"
	if e.ra != nil {
		ctx, what = e.ra.Ctx, "read-ahead cancelled"
	}
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", what, ctx.Err())
	}
}
