package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/gdsfs/gdsfs"
	"github.com/gdsfs/gdsfs/daemon/handover"
	"github.com/gdsfs/gdsfs/fs"
	"github.com/gdsfs/gdsfs/ipc"
	"github.com/gdsfs/gdsfs/staging"
)

// A daemon hands its mount over to a successor: a second `gdsfs mount` of
// the same SOURCE on the same MOUNTPOINT connects to the hand-over socket
// beside the default lease socket, and takes the FUSE connection, the
// lease socket with its consumers' connections and leases, and the staged
// cache. The mount never goes away; the successor serves resident files
// without reading them again. daemon/handover is the wire; each component
// (fs, ipc, staging) hands over its own state.

// Part names on the wire.
const (
	partCache = "cache"
	partIPC   = "ipc"
	partFS    = "fs"
)

// handoverPath is where the daemon serving absMnt waits for a successor.
func handoverPath(absMnt string) string { return handover.Path(ipc.DefaultSocket(absMnt)) }

// hello is this daemon's side of the exchange's opening.
func hello(source, absMnt string) handover.Hello {
	return handover.Hello{Protocol: handover.Protocol, Version: gdsfs.Version, Source: source,
		Mountpoint: absMnt, Pid: os.Getpid()}
}

// canonicalPaths makes SOURCE and MOUNTPOINT absolute with their links
// resolved, as fs.CheckPaths does, for a mount point that is in use.
func canonicalPaths(source, mnt string) (string, string, error) {
	canon := func(what, p string) (string, error) {
		a, err := filepath.Abs(p)
		if err == nil {
			a, err = filepath.EvalSymlinks(a)
		}
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", what, p, err)
		}
		return a, nil
	}
	src, err := canon("SOURCE", source)
	if err != nil {
		return "", "", err
	}
	m, err := canon("MOUNTPOINT", mnt)
	return src, m, err
}

// predecessor connects to the daemon serving mnt when mnt is a live gdsfs
// mount; nil when mnt is not (a normal mount follows). A live gdsfs mount
// whose daemon takes no successor is an error that says so.
func predecessor(source, mnt string) (*handover.Conn, string, string, error) {
	src, absMnt, err := canonicalPaths(source, mnt)
	if err != nil {
		return nil, "", "", nil // fs.CheckPaths names the bad path
	}
	fstype, mounted, dead := mountAt(absMnt)
	if !mounted || dead || fstype != "fuse.gdsfs" {
		return nil, "", "", nil
	}
	path := handoverPath(absMnt)
	c, err := handover.Dial(path)
	if err != nil {
		return nil, "", "", UsageError{fmt.Errorf("MOUNTPOINT %s: busy: a gdsfs daemon serves it and takes no successor here (%v); unmount it first", mnt, err)}
	}
	return c, src, absMnt, nil
}

// encodePart is one component's state for the wire.
func encodePart(name string, st any, files []*os.File) (handover.Part, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return handover.Part{}, fmt.Errorf("hand-over of %s: %w", name, err)
	}
	return handover.Part{Name: name, State: b, Files: len(files)}, nil
}

// decodePart reads one component's state from the wire.
func decodePart(s handover.State, name string, st any) error {
	for _, p := range s.Parts {
		if p.Name == name {
			if err := json.Unmarshal(p.State, st); err != nil {
				return fmt.Errorf("hand-over of %s: %w", name, err)
			}
			return nil
		}
	}
	return fmt.Errorf("hand-over: the predecessor sent no %s", name)
}

// takeOver runs the successor's side of the exchange and starts the
// daemon from what the predecessor hands over: it adopts everything,
// says so, and serves the FUSE connection only once the predecessor
// answers that it let go (or is known to have exited). On success the
// predecessor has let go and waits for c to close before it exits (so
// that a service manager hears of the new main process first); on
// failure it serves on and this daemon holds nothing of it.
func (d *daemon) takeOver(c *handover.Conn, source, mnt, absMnt string) (err error) {
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	log := d.log.With(zap.String("mountpoint", absMnt))
	// The devices before anything stops: opening CUDA takes most of a
	// second, which the mount would otherwise wait through. What opening
	// them logs is held until the running daemon accepts this one: a
	// refused successor says only why.
	held, heldLogs := observer.New(d.log.Level())
	if d.devs, err = openDevices(d.cfg.Staging, zap.New(held)); err != nil {
		replay(d.log, heldLogs)
		return err
	}
	if err := c.SendHello(hello(source, absMnt)); err != nil {
		return fmt.Errorf("hand-over: %w", err)
	}
	theirs, err := c.ReadHello()
	if err != nil {
		return UsageError{fmt.Errorf("MOUNTPOINT %s: busy: the daemon serving it does not hand over to this one: %w", mnt, err)}
	}
	replay(d.log, heldLogs)
	log.Info("taking over from the running daemon", zap.Int("pid", theirs.Pid), zap.String("version", theirs.Version))
	st, files, err := c.ReadState()
	if err != nil {
		return fmt.Errorf("hand-over: %w", err)
	}
	fail := func(err error) error {
		c.SendVerdict(handover.Verdict{Error: err.Error()})
		return err
	}
	split, err := handover.Split(st, files)
	if err != nil {
		handover.CloseFiles(files)
		return fail(err)
	}
	if err := d.adopt(st, split, source, absMnt); err != nil {
		return fail(err)
	}
	if err := c.SendVerdict(handover.Verdict{Taken: true}); err != nil {
		d.abandon()
		return fmt.Errorf("hand-over: %w", err)
	}
	v, err := c.ReadVerdict()
	switch {
	case err == nil && v.Taken:
	case err == nil:
		d.abandon()
		return fmt.Errorf("hand-over: the running daemon kept the mount: %s", v.Error)
	default:
		live, aerr := c.PeerAlive()
		if aerr != nil {
			d.abandon()
			return fmt.Errorf("hand-over: no answer from the running daemon (%v), and whether it still serves cannot be told: %w", err, aerr)
		}
		if live {
			d.abandon()
			return fmt.Errorf("hand-over: no answer from the running daemon (%w), which still runs: it keeps the mount", err)
		}
		// It read our verdict and died before answering, or died
		// before reading it: either way it serves no more.
		log.Warn("the running daemon died during the hand-over; serving on", zap.Int("pid", theirs.Pid), zap.Error(err))
	}
	if err := d.fs.Serve(); err != nil {
		// The predecessor let go: nobody else can serve the mount.
		return err
	}
	log.Info("took over", zap.Int("from_pid", theirs.Pid))
	return nil
}

// replay writes the entries held by an observer to log.
func replay(log *zap.Logger, held *observer.ObservedLogs) {
	for _, e := range held.TakeAll() {
		if ce := log.Named(e.LoggerName).Check(e.Level, e.Message); ce != nil {
			ce.Write(e.Context...)
		}
	}
}

// adopt starts the cache, the lease server and the FUSE server from a
// predecessor's state; on error it has released what it took (never
// what the predecessor still serves). A part the state lacks is started
// afresh (a store kept without the FUSE connection: the mount is made
// again). The files stay the caller's: each part dups what it keeps.
func (d *daemon) adopt(st handover.State, files map[string][]*os.File, source, mnt string) error {
	defer func() {
		for _, fl := range files {
			handover.CloseFiles(fl)
		}
	}()
	has := map[string]bool{}
	for _, p := range st.Parts {
		has[p.Name] = true
	}
	var cs staging.CacheState
	var is ipc.IPCState
	var fsst fs.FUSEState
	err := decodePart(st, partCache, &cs)
	if err == nil && has[partIPC] {
		err = decodePart(st, partIPC, &is)
	}
	if err == nil && has[partFS] {
		err = decodePart(st, partFS, &fsst)
	}
	if err == nil {
		err = d.newCache(source)
	}
	if err != nil {
		return err
	}
	rep, err := d.cache.Adopt(cs, files[partCache])
	if err != nil {
		return err
	}
	d.log.Info("adopted the staged cache", zap.Int("files", rep.Adopted), zap.Int64("bytes", rep.Bytes),
		zap.Int("dropped", len(rep.Dropped)))
	d.adopted = rep
	if has[partIPC] {
		d.ipc, err = ipc.Adopt(d.ipcConfig(source, d.absMnt), is, files[partIPC])
	} else {
		d.ipc, err = ipc.Listen(d.ipcConfig(source, d.absMnt))
	}
	if err != nil {
		return err
	}
	if has[partFS] {
		d.fs, err = fs.Adopt(d.fsConfig(source, mnt), fsst, files[partFS])
	} else {
		if err = clearDeadMount(mnt, d.log); err == nil {
			d.fs, err = fs.Mount(d.fsConfig(source, mnt))
		}
	}
	if err != nil {
		d.ipc.Close() // an adopted server that never served touches nothing of the predecessor's
		d.ipc = nil
		return err
	}
	return nil
}

// abandon lets go of what adopt took without touching what the
// predecessor serves on with.
func (d *daemon) abandon() {
	if d.fs != nil {
		d.fs.Abandon()
		d.fs = nil
	}
	if d.ipc != nil {
		d.ipc.Close() // never served: touches nothing of the predecessor's
		d.ipc = nil
	}
	if d.cache != nil {
		d.cache.Abandon()
		d.cache = nil
	}
}

// successor is a connection whose successor said hello.
type successor struct {
	c     *handover.Conn
	hello handover.Hello
	err   error // its hello was unreadable or of another protocol
}

// listenSuccessors waits for successors on the hand-over socket and
// passes each to the serving loop once it has said hello: one that says
// nothing holds up neither the loop (signals, other successors) nor
// anything it serves. The returned function stops it and closes the
// connections still waiting.
func (d *daemon) listenSuccessors(absMnt string) (<-chan successor, func()) {
	path := handoverPath(absMnt)
	if err := ipc.SocketDir(filepath.Dir(path)); err != nil {
		d.log.Warn("no hand-over socket: a successor cannot take this mount over", zap.Error(err))
		return nil, func() {}
	}
	ln, err := handover.Listen(path)
	if err != nil {
		d.log.Warn("no hand-over socket: a successor cannot take this mount over", zap.Error(err))
		return nil, func() {}
	}
	d.successorLn = ln
	out := make(chan successor)
	ctx, cancel := context.WithCancel(context.Background())
	greet := func(c *handover.Conn) {
		stop := context.AfterFunc(ctx, func() { c.Close() })
		defer stop()
		h, err := c.ReadHello()
		select {
		case out <- successor{c: c, hello: h, err: err}:
		case <-ctx.Done():
			c.Close()
		}
	}
	go func() {
		for {
			c, err := handover.Accept(ln)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					d.log.Warn("hand-over socket", zap.Error(err))
				}
				return
			}
			go greet(c)
		}
	}()
	return out, func() { cancel(); ln.Close() }
}

// handOver runs the running daemon's side with one successor, its hello
// read; true when the successor took the mount (this daemon must then
// exit without unmounting), false when this daemon serves on.
func (d *daemon) handOver(sc successor) bool {
	c, theirs, err := sc.c, sc.hello, sc.err
	defer c.Close()
	log := d.log.With(zap.Int("successor_pid", c.Peer))
	if err != nil {
		log.Warn("hand-over refused", zap.Error(err))
		c.SendRefusal(err.Error())
		return false
	}
	if theirs.Source != d.source || theirs.Mountpoint != d.absMnt {
		why := fmt.Sprintf("this daemon serves SOURCE %s on %s, not SOURCE %s", d.source, d.absMnt, theirs.Source)
		log.Warn("hand-over refused", zap.String("why", why))
		c.SendRefusal(why)
		return false
	}
	if err := c.SendHello(hello(d.source, d.absMnt)); err != nil {
		log.Warn("hand-over failed", zap.Error(err))
		return false
	}
	log.Info("handing the mount over", zap.String("version", theirs.Version))
	st, files, resume, err := d.handoff()
	if err != nil {
		log.Warn("hand-over failed; serving on", zap.Error(err))
		c.SendRefusal(err.Error())
		return false
	}
	// The mount waits while the successor adopts: at most
	// shutdown.handover_timeout, then this daemon serves on.
	timeout := d.cfg.Shutdown.HandoverTimeout
	c.SetDeadline(time.Now().Add(timeout))
	err = c.SendState(st, files)
	handover.CloseFiles(files)
	var v handover.Verdict
	if err == nil {
		v, err = c.ReadVerdict()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Told, so that the successor lets go of what it adopted
			// instead of serving.
			err = fmt.Errorf("no verdict from the successor within shutdown.handover_timeout (%s)", timeout)
			c.SendVerdictNow(handover.Verdict{Error: "the running daemon serves on: " + err.Error()})
		}
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("the successor did not read the state within shutdown.handover_timeout (%s)", timeout)
	}
	c.SetDeadline(time.Time{})
	if err != nil || !v.Taken {
		if err == nil {
			err = errors.New(v.Error)
		}
		resume()
		log.Warn("the successor did not take the mount; serving on", zap.Error(err))
		return false
	}
	d.store.stop(true) // the successor keeps its own
	d.store = nil
	d.letGo()
	if err := c.SendVerdict(handover.Verdict{Taken: true}); err != nil {
		log.Warn("could not tell the successor this daemon let go", zap.Error(err))
	}
	c.WaitClosed() // the successor is the service's main process now
	log.Info("handed the mount over")
	return true
}

// handoff stops the components, FUSE first (the kernel's requests wait
// in /dev/fuse), then the lease server (requests wait in their sockets),
// then snapshots the cache; resume undoes it in reverse.
func (d *daemon) handoff() (handover.State, []*os.File, func(), error) {
	var st handover.State
	var files []*os.File
	var undo []func() error
	resume := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil {
				d.log.Error("cannot serve again after a failed hand-over", zap.Error(err))
			}
		}
	}
	add := func(name string, s any, fl []*os.File, err error, again func() error) error {
		if err != nil {
			return fmt.Errorf("hand-over of %s: %w", name, err)
		}
		undo = append(undo, again)
		p, err := encodePart(name, s, fl)
		if err != nil {
			handover.CloseFiles(fl)
			return err
		}
		st.Parts = append(st.Parts, p)
		files = append(files, fl...)
		return nil
	}
	fsst, fsf, err := d.fs.Handoff()
	err = add(partFS, fsst, fsf, err, d.fs.Resume)
	if err == nil {
		is, isf, ierr := d.ipc.Handoff()
		err = add(partIPC, is, isf, ierr, d.ipc.Resume)
	}
	if err == nil {
		cs, csf, cerr := d.cache.Handoff()
		err = add(partCache, cs, csf, cerr, d.cache.Resume)
	}
	if err != nil {
		handover.CloseFiles(files)
		resume()
		return st, nil, nil, err
	}
	return st, files, resume, nil
}

// letGo ends this daemon's hold after the successor took over (or the
// descriptor store holds all for the unit's restart): nothing it hands
// back unmounts, unlinks or frees what the successor serves. The store
// is the caller's to stop.
func (d *daemon) letGo() {
	d.handedOver = true
	if d.successorLn != nil {
		// Closed before the successor hears it took over, so that it
		// listens on the same path for its own successor; the path is
		// left for it (the listener unlinks only on its first close).
		d.successorLn.SetUnlinkOnClose(false)
		d.successorLn.Close()
	}
	if d.metrics != nil {
		d.metrics.Close() // the successor binds metrics.listen next
		d.metrics = nil
	}
	d.fs.Abandon()
	d.ipc.Abandon()
	if d.stopEvents != nil {
		d.stopEvents()
		d.stopEvents = nil
	}
	d.cache.Abandon()
	d.ipc, d.cache = nil, nil
}
