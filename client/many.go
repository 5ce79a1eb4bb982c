package client

import (
	"fmt"

	"github.com/gdsfs/gdsfs/proto"
)

// item is one path of an OpenMany.
type item struct {
	i   int
	loc location
	f   *mapped
}

// OpenMany leases many files in as few round trips as it can: the files
// this process keeps mapped are leased again together on the connections
// holding them (one acquire_many each, no descriptors when unchanged), the
// rest in one acquire_many per daemon on a new connection, which then
// holds that batch until its last lease closes. It is all or nothing: if
// any file fails, the leases already made are closed and the error names
// the file.
func OpenMany(paths []string) ([]*Lease, error) {
	out := make([]*Lease, len(paths))
	var taken []*mapped // taken for a repeat lease and not yet settled
	settle := func(f *mapped) {
		for k, t := range taken {
			if t == f {
				taken = append(taken[:k], taken[k+1:]...)
				return
			}
		}
	}
	fail := func(err error) ([]*Lease, error) {
		for _, f := range taken {
			reg.discard(f)
		}
		for _, l := range out {
			if l != nil {
				l.Close()
			}
		}
		return nil, err
	}
	var fresh []item
	groups := map[*holder][]item{}
	for i, p := range paths {
		loc, err := locateCached(p)
		if err != nil {
			return fail(err)
		}
		if f := reg.take(loc.key()); f != nil {
			taken = append(taken, f)
			groups[f.conn] = append(groups[f.conn], item{i, loc, f})
		} else {
			fresh = append(fresh, item{i: i, loc: loc})
		}
	}
	for h, items := range groups {
		req := proto.Request{Op: proto.OpAcquireMany}
		for _, it := range items {
			req.Paths = append(req.Paths, it.loc.rel)
			req.Generations = append(req.Generations, it.f.g.Generation)
		}
		resp, files, err := h.c.roundTrip(req)
		if err == nil && len(resp.Files) != len(items) {
			closeAll(files)
			err = &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire_many: %d answers for %d files", len(resp.Files), len(items))}
		}
		if err != nil {
			for _, it := range items {
				settle(it.f)
				reg.discard(it.f)
			}
			if !retry(err) {
				return fail(err)
			}
			fresh = append(fresh, items...)
			continue
		}
		for k, it := range items {
			a := &resp.Files[k]
			n := a.FDs()
			got := files[:min(n, len(files))]
			files = files[len(got):]
			settle(it.f)
			switch {
			case a.OK && a.Reuse && a.Generation != it.f.g.Generation:
				h.c.release(a.Lease, resp.Epoch)
				reg.discard(it.f)
				closeAll(files)
				return fail(&Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire %s: reuse of generation %d answered for %d", paths[it.i], a.Generation, it.f.g.Generation)})
			case a.OK && a.Reuse:
				out[it.i] = &Lease{f: it.f, conn: h.c, id: a.Lease, epoch: resp.Epoch, grant: a.Grant}
			case a.OK:
				nf, err := reg.adopt(h, it.loc, &a.Grant, got)
				reg.discard(it.f)
				if err != nil {
					h.c.release(a.Lease, resp.Epoch)
					closeAll(files)
					return fail(fmt.Errorf("gdsfs acquire %s: map: %w", paths[it.i], err))
				}
				out[it.i] = &Lease{f: nf, conn: h.c, id: a.Lease, epoch: resp.Epoch, grant: a.Grant}
			default:
				reg.discard(it.f)
				if !retry(a.Err()) {
					closeAll(files)
					return fail(a.Err())
				}
				fresh = append(fresh, it)
			}
		}
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
			if err := openBatch(paths, items[:n], out); err != nil {
				return fail(err)
			}
			items = items[n:]
		}
	}
	return out, nil
}

// openBatch leases items on one new connection, filling out.
func openBatch(paths []string, items []item, out []*Lease) error {
	c, err := Dial(items[0].loc.socket)
	if err != nil {
		return err
	}
	req := proto.Request{Op: proto.OpAcquireMany}
	for _, it := range items {
		req.Paths = append(req.Paths, it.loc.rel)
	}
	resp, files, err := c.roundTrip(req)
	if err == nil && len(resp.Files) != len(items) {
		closeAll(files)
		err = &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("gdsfs acquire_many: %d answers for %d files", len(resp.Files), len(items))}
	}
	if err != nil {
		c.Close()
		return err
	}
	h := &holder{c: c, owned: true}
	var firstErr error
	for k, it := range items {
		a := &resp.Files[k]
		got := files[:min(a.FDs(), len(files))]
		files = files[len(got):]
		if firstErr != nil || !a.OK {
			closeAll(got)
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: %w", paths[it.i], a.Err())
			}
			continue
		}
		f, err := reg.adopt(h, it.loc, &a.Grant, got)
		if err != nil {
			firstErr = fmt.Errorf("gdsfs acquire %s: map: %w", paths[it.i], err)
			continue
		}
		out[it.i] = &Lease{f: f, conn: c, id: a.Lease, epoch: resp.Epoch, grant: a.Grant}
	}
	closeAll(files)
	if h.refs == 0 {
		c.Close()
	}
	return firstErr
}
