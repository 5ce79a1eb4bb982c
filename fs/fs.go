package fs

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/staging"
)

// Stager is what fs needs from the staging cache. No method may block.
type Stager interface {
	// OpenedBy tells the cache that a regular file (path relative to
	// SOURCE) was opened for reading through the mount, by r.
	OpenedBy(rel string, r staging.Reader)
	// Closed tells the cache that one such open ended (the kernel
	// released that handle).
	Closed(rel string)
	// Changed tells the cache that the mount changed rel: a write,
	// truncation, attribute change, creation, unlink, rename (both names)
	// or link.
	Changed(rel string)
	// Attr answers the user.gdsfs.state and user.gdsfs.path xattrs.
	Attr(rel string) (state, path string)
}

// Control is one file of MOUNTPOINT/.gdsfs/. Exactly one of Read and Write
// is set.
type Control struct {
	Name string
	// Read returns the content for the reader c; it is snapshotted when
	// the file is opened.
	Read func(c access.Cred) []byte
	// Write is called once per line written, with the line as a path
	// relative to SOURCE, after fs opened that file for reading as the
	// writer c (so c may read it; it is a regular file). Its error
	// becomes the write's errno.
	Write func(c access.Cred, rel string) error
	// WriteArgs, when set, takes lines of the form "PATH<TAB>key=value"
	// (e.g. "data/x.bin\tgpus=0,1") with args the text after the TAB;
	// lines without one go to Write. Without it such a line names a path
	// with a TAB in it, as before.
	WriteArgs func(c access.Cred, rel, args string) error
}

// Config is what Mount needs.
type Config struct {
	Source     string
	Mountpoint string
	Options    Options
	Stager     Stager // nil: nothing is staged
	// Controls returns the control files; it is called before the mount
	// answers any request, with the server the files may report on.
	Controls func(*Server) []Control
	// Watch reports changes to SOURCE (nil: none are; the kernel caches
	// for fuse.entry_timeout and fuse.attr_timeout).
	Watch Watcher
	// Journal keeps the nodes the kernel holds in a memfd that
	// ConnectionState passes on, so a daemon adopting the connection
	// after this one died knows them (journal.go). For a daemon with a
	// service manager's descriptor store.
	Journal bool
	Log     *zap.Logger
}

// Stats are the FUSE-side counters.
type Stats struct {
	Opens          uint64 // regular files opened
	ReadsServed    uint64 // read requests the daemon answered (not passthrough)
	BytesServed    uint64 // bytes asked for by those requests
	Passthrough    bool   // reads bypass the daemon
	PassthroughWhy string // why not, when Passthrough is false
	OpenFiles      int    // files open through the mount now
	OpenPerUID     int    // fuse.max_open_per_uid in force
	OpensRefused   uint64 // opens refused at that bound (EMFILE)
	NotKept        uint64 // files unlinked or renamed over not kept, at the bound (replaced.go)
}

// Server is a mounted gdsfs.
type Server struct {
	fuse        *fuse.Server
	raw         *umaskFS
	tree        *rootNode    // the mount's root node
	root        *access.Root // SOURCE, held open; every access resolves beneath it
	dev         uint64       // SOURCE's device
	source      string
	mountpoint  string
	opts        Options
	stager      Stager
	controls    []Control
	log         *zap.Logger
	errs        errnoLogger
	uid, gid    uint32
	started     time.Time
	closeRoot   sync.Once
	removedOnce sync.Once // noticeRemoved

	// Settled once by Mount; read by open files and Stats.
	passthrough    atomic.Bool
	passthroughWhy atomic.Pointer[string]
	// mountDev is the mount's device number (0 until mounted): a mapping
	// made through the mount shows it in /proc/PID/maps.
	mountDev atomic.Uint64

	opens, reads, readBytes atomic.Uint64
	drain                   drain    // open files, and refusing new opens on shutdown (drain.go)
	fds                     fdBudget // descriptors held per caller uid (fdbudget.go)
	meta                    metaCache

	ids nodeIDs // node ids of backing inodes (nodeids.go)
	// fuseFd is the number of the FUSE descriptor go-fuse serves (-1:
	// unknown); handover.go switches it.
	fuseFd int
	// adopting is the handle the next Open or Opendir returns, while
	// Adopt registers a predecessor's handles (before serving).
	adopting atomic.Pointer[gofs.FileHandle]
	ho       *handover // a hand-over in progress; guarded by hoMu
	hoMu     sync.Mutex
	adopted  bool          // mounted by a predecessor: go-fuse cannot unmount it
	pending  *pendingConn  // adopted, not served yet (adopt.go); guarded by hoMu
	served   chan struct{} // closed when go-fuse stopped serving
}

// Mount mounts SOURCE on MOUNTPOINT. Errors name the path or key at fault.
//
// It sets the process's umask to 0: the kernel already applied the
// caller's umask to the mode of every file created through the mount, and
// the daemon must not apply its own again. Files the daemon makes for
// itself get explicit modes.
func Mount(cfg Config) (*Server, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, err
	}
	source, mnt, err := CheckPaths(cfg.Source, cfg.Mountpoint)
	if err != nil {
		return nil, err
	}
	s, err := prepare(cfg, source, mnt)
	if err != nil {
		return nil, err
	}
	if err := s.serve(mnt); err != nil {
		s.letSourceGo()
		return nil, fmt.Errorf("mount %s: %w", mnt, err)
	}
	if err := s.settlePassthrough(); err != nil {
		s.fuse.Unmount()
		s.letSourceGo()
		return nil, err
	}
	s.raiseReadAhead()
	s.startMeta()
	return s, nil
}

// prepare opens SOURCE and makes the server, up to serving.
func prepare(cfg Config, source, mnt string) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	root, err := access.OpenRoot(source)
	if err != nil {
		return nil, fmt.Errorf("SOURCE %s: %w", source, unwrapPath(err))
	}
	limit, err := noFile()
	if err != nil {
		root.Close()
		return nil, err
	}
	perUID, err := cfg.Options.OpenPerUID(limit)
	if err != nil {
		root.Close()
		return nil, err
	}
	var st unix.Stat_t
	root.At(func(dirfd int) error { return unix.Fstat(dirfd, &st) })
	s := &Server{
		root: root, dev: st.Dev, source: source, mountpoint: mnt, opts: cfg.Options, stager: cfg.Stager,
		log: cfg.Log, errs: errnoLogger{log: cfg.Log},
		uid: uint32(os.Geteuid()), gid: uint32(os.Getegid()), started: time.Now(),
		fuseFd: -1, ids: nodeIDs{srcDev: st.Dev},
	}
	s.fds = fdBudget{perUID: perUID, exempt: s.uid, log: cfg.Log,
		open: map[uint32]int{}, logged: map[uint32]time.Time{}}
	s.setPassthrough(cfg.Options.Passthrough != PassthroughOff, "")
	if cfg.Controls != nil {
		s.controls = cfg.Controls(s)
	}
	if root.At(func(dirfd int) error {
		return unix.Fstatat(dirfd, controlDirName, &st, unix.AT_SYMLINK_NOFOLLOW)
	}) == nil {
		s.log.Warn("SOURCE has its own .gdsfs; the control directory hides it", zap.String("source", source))
	}
	syscall.Umask(0)
	s.probeMeta(cfg.Watch, cfg.Journal)
	return s, nil
}

// CheckPaths checks SOURCE and MOUNTPOINT (existing directories, the
// mountpoint free and outside SOURCE) and returns them absolute.
func CheckPaths(source, mnt string) (string, string, error) {
	if source == "" || mnt == "" {
		return "", "", errors.New("want SOURCE and MOUNTPOINT")
	}
	src, err := filepath.Abs(source)
	if err == nil {
		src, err = filepath.EvalSymlinks(src)
	}
	if err != nil {
		return "", "", fmt.Errorf("SOURCE %s: %w", source, unwrapPath(err))
	}
	if st, err := os.Stat(src); err != nil {
		return "", "", fmt.Errorf("SOURCE %s: %w", source, unwrapPath(err))
	} else if !st.IsDir() {
		return "", "", fmt.Errorf("SOURCE %s: not a directory", source)
	}
	// A symbolic link is resolved first: mounting on a link to a mount
	// point would stack a second mount there.
	m, err := filepath.Abs(mnt)
	if err == nil {
		m, err = filepath.EvalSymlinks(m)
	}
	if err != nil {
		return "", "", fmt.Errorf("MOUNTPOINT %s: %w", mnt, unwrapPath(err))
	}
	if st, err := os.Stat(m); err != nil {
		return "", "", fmt.Errorf("MOUNTPOINT %s: %w", mnt, unwrapPath(err))
	} else if !st.IsDir() {
		return "", "", fmt.Errorf("MOUNTPOINT %s: not a directory", mnt)
	}
	if fstype, ok := mountinfo.MountedAt(m); ok {
		return "", "", fmt.Errorf("MOUNTPOINT %s: busy: already a mount point (%s); unmount it first", mnt, fstype)
	}
	if strings.HasPrefix(m+"/", src+"/") {
		return "", "", fmt.Errorf("MOUNTPOINT %s: inside SOURCE %s; the mount would mirror itself", mnt, source)
	}
	return src, m, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// serve mounts the node tree (as gofs.Mount does, with the umask layer in
// front of it) and serves it.
func (s *Server) serve(mnt string) error {
	opts := s.mountOptions()
	s.newTree(opts)
	fdMu.Lock()
	before := fuseFds()
	srv, err := fuse.NewServer(s.raw, mnt, &opts.MountOptions)
	if err == nil {
		s.fuseFd = newFuseFd(before, fuseFds())
	}
	fdMu.Unlock()
	if err != nil {
		return err
	}
	s.goServe(srv)
	if err := srv.WaitMount(); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err == nil {
		s.mountDev.Store(st.Dev)
	}
	s.fuse = srv
	return nil
}

// newTree makes the root node and the layers go-fuse serves.
func (s *Server) newTree(opts *gofs.Options) {
	s.tree = &rootNode{node: node{srv: s}}
	s.raw = &umaskFS{RawFileSystem: gofs.NewNodeFS(s.tree, opts)}
	s.raw.refs.init()
	if s.meta.journal != nil {
		s.raw.refs.noteFh = s.meta.noteHandle
	}
}

func (s *Server) mountOptions() *gofs.Options {
	o := s.opts
	mo := fuse.MountOptions{
		AllowOther:        o.AllowOther,
		FsName:            s.source,
		Name:              "gdsfs",
		MaxWrite:          int(o.MaxRead),
		MaxReadAhead:      int(o.MaxRead),
		EnableLocks:       true,
		DirectMountStrict: os.Geteuid() == 0,
		// The kernel checks permissions with ACLs, as SOURCE's
		// filesystem would (it reads them through getxattr), and passes
		// the umask of creating calls to the daemon (umask.go).
		EnableAcl:         true,
		ExtraCapabilities: fuse.CAP_DONT_MASK,
		Debug:             o.Debug,
		MaxStackDepth:     stackDepthFor(s.source),
		Logger:            log.New(&zapWriter{s.log}, "", 0),
	}
	if o.AllowOther {
		mo.Options = append(mo.Options, "default_permissions")
	}
	// Flags for mount(2) as root, and the same words for fusermount.
	mo.DirectMountFlags = unix.MS_NOSUID | unix.MS_NODEV
	for _, f := range o.MountFlags {
		mo.DirectMountFlags |= mountFlagBits[f]
		mo.Options = append(mo.Options, f)
	}
	if o.Passthrough == PassthroughOff {
		mo.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	return &gofs.Options{
		MountOptions:    mo,
		AttrTimeout:     &o.AttrTimeout,
		EntryTimeout:    &o.EntryTimeout,
		NullPermissions: true,
		// Node ids are the daemon's choice (nodeids.go), so that a
		// successor daemon answers for the same ones (handover.go).
		ExternalNodeID: true,
	}
}

// stackDepthFor allows passthrough to files on a stacked filesystem
// (overlayfs, as in containers): the kernel refuses backing files whose
// stack depth reaches the mount's.
func stackDepthFor(source string) int {
	var st unix.Statfs_t
	if unix.Statfs(source, &st) == nil && st.Type == unix.OVERLAYFS_SUPER_MAGIC {
		return 2
	}
	return 1
}

// settlePassthrough decides once whether the kernel serves reads from the
// backing files, by registering a probe backing file.
func (s *Server) settlePassthrough() error {
	if s.opts.Passthrough == PassthroughOff {
		s.setPassthrough(false, "fuse.passthrough is off")
		return nil
	}
	why := ""
	if s.fuse.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		why = "the kernel does not offer FUSE passthrough (needs Linux >= 6.9)"
	} else if err := probeBackingFd(s.fuse); err != nil {
		why = err.Error()
	}
	if why == "" {
		s.setPassthrough(true, "")
		return nil
	}
	if s.opts.Passthrough == PassthroughOn {
		return fmt.Errorf("fuse.passthrough: on, but %s", why)
	}
	s.setPassthrough(false, why)
	s.log.Info("kernel passthrough unavailable; the daemon serves reads", zap.String("reason", why))
	return nil
}

func (s *Server) setPassthrough(on bool, why string) {
	s.passthroughWhy.Store(&why)
	s.passthrough.Store(on)
}

func probeBackingFd(srv *fuse.Server) error {
	fd, err := unix.MemfdCreate("gdsfs-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("passthrough probe: %w", err)
	}
	defer unix.Close(fd)
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		return fmt.Errorf("registering a backing file failed (%v; needs CAP_SYS_ADMIN)", errno)
	}
	srv.UnregisterBackingFd(id)
	return nil
}

// raiseReadAhead sets the mount's bdi read_ahead_kb so sequential reads
// served by the daemon arrive as max_read requests.
func (s *Server) raiseReadAhead() {
	if s.opts.ReadAhead == 0 {
		return
	}
	var st unix.Stat_t
	if err := unix.Stat(s.mountpoint, &st); err != nil {
		s.log.Warn("read-ahead left unchanged", zap.Error(err))
		return
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	kb := fmt.Sprint(int64(s.opts.ReadAhead) / 1024)
	if err := os.WriteFile(p, []byte(kb), 0); err != nil {
		s.log.Warn("read-ahead left unchanged", zap.String("file", p), zap.Error(err))
	}
}

// goServe serves srv until the connection ends.
func (s *Server) goServe(srv *fuse.Server) {
	s.served = make(chan struct{})
	go func() {
		srv.Serve()
		close(s.served)
	}()
}

// Wait blocks until the file system is unmounted, then lets SOURCE go.
func (s *Server) Wait() {
	<-s.served
	s.letSourceGo()
}

// letSourceGo ends the change watching of SOURCE's entries and closes
// SOURCE's root (once, whoever calls it first).
func (s *Server) letSourceGo() {
	s.meta.close()
	s.closeRoot.Do(func() { s.root.Close() })
}

// noticeRemoved logs, once, that SOURCE was removed: the mount serves the
// directory it mounted, as a bind mount does, not one made at its path
// since.
func (s *Server) noticeRemoved() {
	var st unix.Stat_t
	if s.root.At(func(dirfd int) error { return unix.Fstat(dirfd, &st) }) != nil || st.Nlink > 0 {
		return
	}
	s.removedOnce.Do(func() {
		s.log.Warn("SOURCE was removed: the mount serves the removed directory (empty) until it is mounted again",
			zap.String("source", s.source))
	})
}

// CanRead reports whether c may open rel (relative to SOURCE) for reading:
// the kernel decides, as c, opening without blocking.
func (s *Server) CanRead(c access.Cred, rel string) bool {
	f, _, err := s.root.OpenRegular(c, rel, 0, access.Beneath)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// Unmount unmounts; it fails with EBUSY while files are open.
func (s *Server) Unmount() error {
	if s.adopted {
		return unmountAdopted(s.mountpoint)
	}
	return s.fuse.Unmount()
}

// Mountpoint is the absolute mount point.
func (s *Server) Mountpoint() string { return s.mountpoint }

// NodeID is the inode number a stat through the mount shows for the
// backing inode ino of device dev, and whether the mount has given it
// one (a file of SOURCE's own filesystem always has one).
func (s *Server) NodeID(dev, ino uint64) (uint64, bool) { return s.ids.known(dev, ino) }

// Stats returns the FUSE-side counters.
func (s *Server) Stats() Stats {
	return Stats{
		Opens: s.opens.Load(), ReadsServed: s.reads.Load(), BytesServed: s.readBytes.Load(),
		Passthrough: s.passthrough.Load(), PassthroughWhy: *s.passthroughWhy.Load(),
		OpenFiles: s.OpenFiles(), OpenPerUID: s.fds.perUID, OpensRefused: s.fds.refused.Load(), NotKept: s.fds.notKept.Load(),
	}
}

// zapWriter carries go-fuse's log lines into zap at debug level.
type zapWriter struct{ log *zap.Logger }

func (w *zapWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimRight(string(p), "\n"), zap.String("component", "go-fuse"))
	return len(p), nil
}
