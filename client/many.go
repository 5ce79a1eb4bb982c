package client

import (
	"fmt"
	"os"

	"github.com/gdsfs/gdsfs/proto"
)

// item is one path of an OpenMany.
type item struct {
	i   int
	loc location
	f   *mapped
}

// batch is one OpenMany in progress.
type batch struct {
	paths []string
	out   []*Lease
	taken []*mapped // kept mappings taken for a repeat lease, not yet settled
}

// settle marks a taken mapping as dealt with (leased or discarded).
func (b *batch) settle(f *mapped) {
	for k, t := range b.taken {
		if t == f {
			b.taken = append(b.taken[:k], b.taken[k+1:]...)
			return
		}
	}
}

// fail undoes what the batch made and returns err.
func (b *batch) fail(err error) ([]*Lease, error) {
	for _, f := range b.taken {
		reg.discard(f)
	}
	for _, l := range b.out {
		if l != nil {
			l.Close()
		}
	}
	return nil, err
}

// OpenMany leases many files in as few round trips as it can: the files
// this process keeps mapped are leased again together on the connections
// holding them (one acquire_many each, no descriptors when unchanged), the
// rest in one acquire_many per daemon on a connection of the process's
// pool for it (see holder). It is all or nothing: if
// any file fails, the leases already made are closed and the error names
// the file.
//
// opts: OnDevice (default DefaultDevice) and RoomWait, for every file.
func OpenMany(paths []string, opts ...LeaseOption) ([]*Lease, error) {
	b := &batch{paths: paths, out: make([]*Lease, len(paths))}
	var fresh []item
	groups := map[*holder][]item{}
	for i, p := range paths {
		loc, err := locateOn(p, opts)
		if err != nil {
			return b.fail(err)
		}
		if f := reg.take(loc.key()); f != nil {
			b.taken = append(b.taken, f)
			groups[f.conn] = append(groups[f.conn], item{i, loc, f})
		} else {
			fresh = append(fresh, item{i: i, loc: loc})
		}
	}
	for h, items := range groups {
		again, err := b.repeat(h, items)
		if err != nil {
			return b.fail(err)
		}
		fresh = append(fresh, again...)
	}
	bySocket := map[string][]item{}
	var order []string
	for _, it := range fresh {
		if bySocket[it.loc.socket] == nil {
			order = append(order, it.loc.socket)
		}
		bySocket[it.loc.socket] = append(bySocket[it.loc.socket], it)
	}
	for _, socket := range order {
		items := bySocket[socket]
		for len(items) > 0 {
			n := min(len(items), proto.MaxBatch)
			if err := openBatch(paths, items[:n], b.out); err != nil {
				return b.fail(err)
			}
			items = items[n:]
		}
	}
	return b.out, nil
}

// repeat leases items again on the connection holding their mappings. It
// returns the items to lease afresh: changed files, or all of them when
// the connection failed.
func (b *batch) repeat(h *holder, items []item) ([]item, error) {
	req := proto.Request{Op: proto.OpAcquireMany, Device: items[0].loc.device, RoomWaitMS: items[0].loc.roomWaitMS}
	for _, it := range items {
		req.Paths = append(req.Paths, it.loc.rel)
		req.Generations = append(req.Generations, it.f.g.Generation)
	}
	resp, files, err := h.c.roundTrip(req)
	if err == nil && len(resp.Files) != len(items) {
		closeAll(files)
		releaseGranted(h.c, resp.Files, resp.Epoch)
		err = &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire_many: %d answers for %d files", len(resp.Files), len(items))}
	}
	if err != nil {
		for _, it := range items {
			b.settle(it.f)
			reg.discard(it.f)
		}
		if !retry(err) {
			return nil, err
		}
		return items, nil
	}
	defer func() { closeAll(files) }()
	var again []item
	for k, it := range items {
		a := &resp.Files[k]
		got := files[:min(a.FDs(), len(files))]
		files = files[len(got):]
		b.settle(it.f)
		lease, err := b.repeatOne(h, it, a, resp.Epoch, got)
		switch {
		case lease != nil:
			b.out[it.i] = lease
		case err != nil && !retry(err):
			releaseGranted(h.c, resp.Files[k+1:], resp.Epoch) // the connection may stay open for other leases
			return nil, err
		default:
			again = append(again, it)
		}
	}
	return again, nil
}

// repeatOne turns one item of a repeat acquire_many into a lease, or an
// error (a retry-worthy one: lease it afresh).
func (b *batch) repeatOne(h *holder, it item, a *proto.Item, epoch uint64, files []*os.File) (*Lease, error) {
	switch {
	case a.OK && a.Reuse && a.Generation == it.f.g.Generation:
		return &Lease{f: it.f, conn: h.c, id: a.Lease, epoch: epoch, grant: a.Grant}, nil
	case a.OK && a.Reuse:
		h.c.release(a.Lease, epoch)
		reg.discard(it.f)
		return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire %s: reuse of generation %d answered for %d", b.paths[it.i], a.Generation, it.f.g.Generation)}
	case a.OK:
		nf, err := reg.adopt(h, it.loc, &a.Grant, files)
		reg.discard(it.f)
		if err != nil {
			giveBack(h.c, &a.Grant, epoch)
			return nil, fmt.Errorf("gdsfs acquire %s: map: %w", b.paths[it.i], err)
		}
		return &Lease{f: nf, conn: h.c, id: a.Lease, epoch: epoch, grant: a.Grant}, nil
	}
	reg.discard(it.f)
	return nil, fmt.Errorf("%s: %w", b.paths[it.i], a.Err())
}

// releaseGranted gives back the files of an answer that were granted and
// not turned into leases: a reuse is released (its mapping is discarded,
// which drops it), a full grant released and dropped (the daemon counts
// it as one more mapping).
func releaseGranted(c *Conn, items []proto.Item, epoch uint64) {
	for i := range items {
		switch {
		case items[i].OK && items[i].Reuse:
			c.release(items[i].Lease, epoch)
		case items[i].OK:
			giveBack(c, &items[i].Grant, epoch)
		}
	}
}

// openBatch leases items on a connection of the process's pool for their
// daemon (see pooled), filling out.
func openBatch(paths []string, items []item, out []*Lease) error {
	req := proto.Request{Op: proto.OpAcquireMany, Device: items[0].loc.device, RoomWaitMS: items[0].loc.roomWaitMS}
	for _, it := range items {
		req.Paths = append(req.Paths, it.loc.rel)
	}
	loc := items[0].loc
	h, resp, files, err := pooled(&loc, func(location) proto.Request { return req }, nil)
	if h == nil {
		return err
	}
	defer reg.checkin(h)
	c := h.c
	if err == nil && len(resp.Files) != len(items) {
		closeAll(files)
		releaseGranted(c, resp.Files, resp.Epoch)
		err = &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire_many: %d answers for %d files", len(resp.Files), len(items))}
	}
	if err != nil {
		dropIfPressed(err, items[0].loc.socket)
		return err
	}
	var firstErr error
	for k, it := range items {
		a := &resp.Files[k]
		got := files[:min(a.FDs(), len(files))]
		files = files[len(got):]
		if firstErr != nil || !a.OK {
			closeAll(got)
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", paths[it.i], a.Err())
			} else if a.OK {
				giveBack(c, &a.Grant, resp.Epoch) // earlier files stay leased
			}
			continue
		}
		f, err := reg.adopt(h, it.loc, &a.Grant, got)
		if err != nil {
			giveBack(c, &a.Grant, resp.Epoch)
			firstErr = fmt.Errorf("gdsfs acquire %s: map: %w", paths[it.i], err)
			continue
		}
		out[it.i] = &Lease{f: f, conn: c, id: a.Lease, epoch: resp.Epoch, grant: a.Grant}
	}
	closeAll(files)
	if firstErr != nil {
		dropIfPressed(firstErr, items[0].loc.socket)
	}
	return firstErr
}
