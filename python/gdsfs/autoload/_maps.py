"""Which file backs an address: an index of this process's mappings of
files under gdsfs mounts.

A move of memory outside span (the lowest start and highest end of the
entries) is not looked at further: one comparison. find(addr) is the next
step, a bisect over the sorted starts; neither makes a system call. A hooked call that maps a file on
a mount (np.memmap, torch.from_file, UntypedStorage.from_file) adds its
mapping at once (mapped(): confirmed by /proc/self/map_files, dropping the
entries whose mappings are gone). The whole index is rebuilt from
/proc/self/maps when that cannot be done, and, for mappings nobody hooked,
on a miss of a large tensor at most once per DISCOVER_INTERVAL seconds. An
entry found is a candidate only: the caller asks the kernel which file,
from which offset, shared or private, is mapped at the address now
(vma_at: the index cannot know of a mapping replaced in place), and checks
that the bytes at those addresses are still the file's. alive() (no system
call while the object owning a hooked mapping lives) only decides which
entries the index keeps."""

import bisect
import errno
import fcntl
import os
import struct
import threading
import time
import weakref

from .._mount import FSTYPE, read_mountinfo

PAGE = os.sysconf("SC_PAGE_SIZE")
DISCOVER_BYTES = 1 << 20  # a miss of at least this many bytes may rebuild the index ...
DISCOVER_INTERVAL = 1.0  # ... at most this often (seconds)
DISCOVER_NUMEL = DISCOVER_BYTES // 16  # elements of the largest dtype in DISCOVER_BYTES: fewer never rebuild

_lock = threading.Lock()
# The index, one tuple (starts, entries) replaced whole under _lock and
# read without it: starts[i] is entries[i].start, sorted; the entries do
# not overlap.
index = ([], [])
# (lowest start, highest end) of the index's entries, (0, 0) when empty:
# the one comparison a move of memory outside every entry pays.
span = (0, 0)
dirty = False  # a hooked call made a mapping the index could not add
refreshes = 0  # rebuilds done by this process (the tests count them)
_last = 0.0  # time.monotonic() of the last rebuild
discover_at = 0.0  # _last + DISCOVER_INTERVAL: a large miss after this may rebuild
# (st_dev, st_ino) -> (size, mtime_ns, ctime_ns) of the file when a hooked
# call mapped it, or when a rebuild first saw it mapped.
_idents = {}
# keys of _idents that only a lease taken ahead put there (remember()): the
# first mapping seen of the file replaces them
_provisional = set()


class Mapping:
    """One VMA of a file under a gdsfs mount."""

    __slots__ = ("start", "end", "offset", "dev", "ino", "path", "shared", "writable", "owner")

    def __init__(self, start, end, offset, dev, ino, path, shared, writable, owner=None):
        self.start, self.end, self.offset = start, end, offset
        self.dev, self.ino, self.path = dev, ino, path
        self.shared, self.writable = shared, writable
        # a weak reference to the object whose life the mapping lasts (an
        # mmap.mmap, a storage), for hooked mappings: None when unknown
        self.owner = owner

    @property
    def key(self):
        return (self.dev, self.ino)

    def __repr__(self):
        return "Mapping(%#x-%#x +%d %s %s%s)" % (self.start, self.end, self.offset, self.path,
                                                 "s" if self.shared else "p", "w" if self.writable else "")


def find(addr):
    """The entry holding addr, or None. No system call."""
    starts, entries = index
    i = bisect.bisect_right(starts, addr) - 1
    if i >= 0:
        e = entries[i]
        if e.start <= addr < e.end:
            return e
    return None


def _set_index(entries):
    """Publish entries (sorted by start, not overlapping) as the index.
    Called under _lock."""
    global index, span
    index = ([e.start for e in entries], entries)
    span = (entries[0].start, entries[-1].end) if entries else (0, 0)


def after_miss(addr, t):
    """find(addr) missed for tensor t: rebuild the index and look again when
    a hooked call mapped a file since, or when t is large and the last
    rebuild is a while ago (mappings made by code nobody hooked)."""
    if dirty or (t.nelement() * t.element_size() >= DISCOVER_BYTES and time.monotonic() >= discover_at):
        refresh()
        return find(addr)
    return None


UNKNOWN = object()  # note(): whether the file is on a gdsfs mount cannot be told


def note(path=None):
    """A hooked call is about to map path (a path, an open file or a
    descriptor): its stat for mapped() when it is on a gdsfs mount, whose
    identity now is remembered (a file changed after this no longer
    matches, until it is mapped again); None for a file elsewhere; UNKNOWN
    (and the next miss rebuilds the index) when it cannot be told."""
    global dirty
    try:
        if isinstance(path, int):
            st = os.fstat(path)
        elif hasattr(path, "fileno"):
            st = os.fstat(path.fileno())
        else:
            st = os.stat(path)
    except (OSError, TypeError, ValueError, AttributeError):
        dirty = True
        return UNKNOWN
    if not _on_gdsfs(st.st_dev):
        return None
    with _lock:
        # every mapping of the file shows its page cache: the version mapped now
        _idents[(st.st_dev, st.st_ino)] = identity(st)
        _provisional.discard((st.st_dev, st.st_ino))
    return st


def mapped(st, start, length, offset, shared, writable, owner=None):
    """The hooked call that note() returned st for mapped length bytes of
    the file from offset at address start: index it now (confirmed by
    /proc/self/map_files), or leave it to the next rebuild. owner: the
    object that unmaps it when it is collected (or closed), if any.
    Returns the entry indexed, or None."""
    global dirty
    if st is None:
        return None
    if st is UNKNOWN or not start or length <= 0:
        dirty = True
        return None
    end = -(-(start + length) // PAGE) * PAGE
    try:
        path = _undeleted(os.readlink("/proc/self/map_files/%x-%x" % (start, end)))
        now = os.stat(path)
    except OSError:
        dirty = True  # merged with a neighbour, or map_files unreadable: read the maps
        return None
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        dirty = True
        return None
    ref = None
    if owner is not None:
        try:
            ref = weakref.ref(owner)
        except TypeError:
            pass
    e = Mapping(start, end, offset, st.st_dev, st.st_ino, path, shared, writable, ref)
    with _lock:
        # entries overlapping the new mapping are gone (it replaced them),
        # and so are those whose mapping is no longer there
        entries = [x for x in index[1] if (x.end <= start or x.start >= end) and alive(x)]
        entries.append(e)
        entries.sort(key=lambda x: x.start)
        _set_index(entries)
    return e


_devs = {}  # st_dev -> whether it is a gdsfs mount's, read from mountinfo once per device


def _on_gdsfs(dev):
    known = _devs.get(dev)
    if known is None:
        try:
            known = dev in _gdsfs_devs()
        except OSError:
            return True
        if len(_devs) > 1024:
            _devs.clear()
        _devs[dev] = known
    return known


def identity(st):
    """What a file's change is told by: (size, mtime_ns, ctime_ns)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(key, ident):
    """A file not mapped yet is leased ahead as of ident: remembered as
    note() would (what a move checks against), until a mapping of the file
    is first seen (note(), refresh()) or forget(). False where the file
    was seen mapped as another version: its mappings' moves decide."""
    with _lock:
        if key not in _idents:
            _idents[key] = ident
            _provisional.add(key)
        return _idents[key] == ident


def forget(key, ident):
    """Undo remember(key, ident) where no mapping replaced it (the lease
    ahead was not taken)."""
    with _lock:
        if key in _provisional and _idents.get(key) == ident:
            del _idents[key]
            _provisional.discard(key)


def ident_of(key):
    return _idents.get(key)


def _gdsfs_devs():
    """st_dev of every gdsfs mount: {dev: mount point}."""
    out = {}
    for e in read_mountinfo():
        if e.fstype == FSTYPE:
            major, _, minor = e.majmin.partition(":")
            out[os.makedev(int(major), int(minor))] = e.mountpoint
    return out


def parse_maps(data, devs):
    """The Mappings of /proc/self/maps text data (bytes) whose device is in
    devs."""
    out = []
    for line in _lines_with(data, [b" %02x:%02x " % (os.major(d), os.minor(d)) for d in devs]):
        f = line.split(None, 5)
        if len(f) < 6:
            continue
        major, _, minor = f[3].partition(b":")
        try:
            dev = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if dev not in devs:
            continue
        lo, _, hi = f[0].partition(b"-")
        perms = f[1]
        out.append(Mapping(int(lo, 16), int(hi, 16), int(f[2], 16), dev, int(f[4]),
                           _undeleted(os.fsdecode(f[5].rstrip(b"\n"))), perms[3:4] == b"s", perms[1:2] == b"w"))
    return out


def _undeleted(path):
    """path without the " (deleted)" the kernel adds to the name of a
    mapped file whose directory entry was dropped: a FUSE mount's entry is
    dropped when it is looked up again, of a file still there. Every use
    of the path checks the file's (dev, ino), so a file really deleted (or
    replaced by another) is not taken for the one mapped."""
    return path[:-10] if path.endswith(" (deleted)") else path


def _lines_with(data, tags):
    """The lines of data holding one of tags (found by bytes.find: a
    process has thousands of mappings, a few of them gdsfs files')."""
    for tag in tags:
        i = data.find(tag)
        while i >= 0:
            start = data.rfind(b"\n", 0, i) + 1
            end = data.find(b"\n", i)
            if end < 0:
                end = len(data)
            yield data[start:end]
            i = data.find(tag, end)


def refresh():
    """Rebuild the index from /proc/self/maps. Returns the keys (dev, ino)
    mapped now."""
    global dirty, refreshes, _last, discover_at
    with _lock:
        dirty = False
        refreshes += 1
        _last = time.monotonic()
        discover_at = _last + DISCOVER_INTERVAL
        devs = _gdsfs_devs()
        found = []
        if devs:
            with open("/proc/self/maps", "rb") as f:
                found = sorted(parse_maps(f.read(), devs), key=lambda e: e.start)
        keys = {e.key for e in found}
        owners = {(x.start, x.end, x.key): x.owner for x in index[1] if x.owner is not None}
        for e in found:
            e.owner = owners.get((e.start, e.end, e.key))
            if e.key not in _idents or e.key in _provisional:
                try:
                    st = os.stat(e.path)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) == e.key:
                    _idents[e.key] = identity(st)
                    _provisional.discard(e.key)
        for k in [k for k in _idents if k not in keys and k[0] in devs]:
            del _idents[k]
        if len(_idents) > 4096:  # files noted but never mapped
            for k in [k for k in _idents if k not in keys]:
                del _idents[k]
        _provisional.intersection_update(_idents)
        _set_index(found)
    return keys


def alive(e):
    """Whether e's VMA is still there: without a system call while the
    object owning a hooked mapping lives and is not closed, else as
    still_mapped."""
    ref = e.owner
    if ref is not None:
        o = ref()
        if o is not None and not getattr(o, "closed", False):
            return True
        e.owner = None  # gone: the address range may hold another mapping now
    return still_mapped(e)


# ioctl(PROCMAP_QUERY) on /proc/self/maps (Linux 6.11): the VMA holding an
# address, without reading the whole file. _IOWR('f', 17, struct procmap_query).
_QUERY = struct.Struct("=QQQQQQQQQIIIIQQ")
_PROCMAP_QUERY = (3 << 30) | (_QUERY.size << 16) | (ord("f") << 8) | 17
_Q_SHARED, _Q_WRITABLE = 0x08, 0x02
query_ok = True  # False once the kernel refused the ioctl: /proc/self/maps is read instead
_self_fds = {}  # name under /proc/self -> its descriptor, kept open (maps for the ioctl, pagemap)


def _self_fd(name):
    """This process's /proc/self/NAME, opened once (again after a fork:
    the parent's descriptor reads the parent)."""
    fd = _self_fds.get(name)
    if fd is None:
        fd = os.open("/proc/self/" + name, os.O_RDONLY | os.O_CLOEXEC)
        with _lock:
            if name in _self_fds:
                os.close(fd)
                fd = _self_fds[name]
            else:
                _self_fds[name] = fd
    return fd


def vma_at(addr, dev):
    """The mapping of a file that holds addr now, as a Mapping (path None
    when asked of the kernel), or None when addr is in no mapping of a file
    (or, where the whole /proc/self/maps is read, in none of device dev's):
    one ioctl(PROCMAP_QUERY), else one read of /proc/self/maps. Whatever
    was indexed for addr, this says which file, from which offset, shared
    or private, is there now (a mapping replaced in place by mmap
    MAP_FIXED keeps the owner and the map_files link of the old one)."""
    global query_ok
    if query_ok:
        buf = bytearray(_QUERY.pack(_QUERY.size, 0, addr, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        try:
            fcntl.ioctl(_self_fd("maps"), _PROCMAP_QUERY, buf, True)
        except OSError as err:
            if err.errno == errno.ENOENT:
                return None  # no VMA holds addr
            if err.errno not in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            query_ok = False
        else:
            (_, _, _, start, end, flags, _, offset, ino, major, minor, _, _, _, _) = _QUERY.unpack(buf)
            if not ino:
                return None  # anonymous memory
            return Mapping(start, end, offset, os.makedev(major, minor), ino, None,
                           bool(flags & _Q_SHARED), bool(flags & _Q_WRITABLE))
    with open("/proc/self/maps", "rb") as f:
        data = f.read()
    for e in parse_maps(data, (dev,)):
        if e.start <= addr < e.end:
            return e
    return None


def still_mapped(e):
    """Whether e's VMA is still there, a mapping of the same file: its
    /proc/self/map_files link names e's path."""
    try:
        return os.readlink("/proc/self/map_files/%x-%x" % (e.start, e.end)) == e.path
    except OSError:
        return False


def _forget_self_fds():
    """After a fork: the parent's /proc/self descriptors read the parent."""
    global _self_fds, _lock
    _lock = threading.Lock()  # another thread of the parent may have held it
    fds, _self_fds = list(_self_fds.values()), {}
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_self_fds)


# ioctl(PAGEMAP_SCAN) on /proc/self/pagemap (Linux 6.7): struct
# pm_scan_arg, the page categories it filters on, and struct page_region.
_PAGEMAP_SCAN = 0xC0606610  # _IOWR('f', 16, struct pm_scan_arg)
_SCAN_ARG = struct.Struct("=12Q")
_IS_FILE, _IS_PRESENT, _IS_SWAPPED = 1 << 2, 1 << 3, 1 << 4
_REGIONS = 32
scan_ok = True  # PAGEMAP_SCAN answers; False once it did not (an older kernel)


def _scan_written(lo, hi):
    """written_pages by PAGEMAP_SCAN: the ranges of pages not the file's
    (FILE inverted) and present or swapped; one ioctl when none is. None
    where the kernel has no PAGEMAP_SCAN."""
    global scan_ok
    import ctypes

    vec = (ctypes.c_uint64 * (3 * _REGIONS))()
    start, end, n = lo - lo % PAGE, hi + (-hi) % PAGE, 0
    fd = _self_fd("pagemap")
    while start < end:
        buf = bytearray(_SCAN_ARG.pack(_SCAN_ARG.size, 0, start, end, 0, ctypes.addressof(vec), _REGIONS, 0,
                                       _IS_FILE, _IS_FILE, _IS_PRESENT | _IS_SWAPPED, _IS_FILE))
        try:
            got = fcntl.ioctl(fd, _PAGEMAP_SCAN, buf, True)
        except OSError as err:
            if err.errno not in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            scan_ok = False
            return None
        for i in range(got):
            n += (vec[3 * i + 1] - vec[3 * i]) // PAGE
        walk_end = _SCAN_ARG.unpack(buf)[4]
        if got < _REGIONS or walk_end <= start:
            break
        start = walk_end
    return n


def written_pages(lo, hi):
    """How many pages of [lo, hi) of a private file mapping are no longer
    the file's (written in memory: anonymous now, or swapped): one
    ioctl(PAGEMAP_SCAN) where the kernel has it, else a read of
    /proc/self/pagemap over the pages; None when neither can be read."""
    if scan_ok:
        try:
            n = _scan_written(lo, hi)
        except OSError:
            return None
        if n is not None:
            return n
    first, last = lo // PAGE, (hi - 1) // PAGE
    n = last - first + 1
    try:
        fd = _self_fd("pagemap")
        buf = bytearray(n * 8)
        mv, got = memoryview(buf), 0
        while got < len(buf):
            k = os.preadv(fd, [mv[got:]], first * 8 + got)
            if k <= 0:
                return None
            got += k
    except OSError:
        return None
    # bit 63 present, 62 swapped, 61 a file page (or shared anonymous):
    # written means present and not a file page, or swapped
    if n <= 512:
        return sum(1 for v in memoryview(buf).cast("Q") if (v >> 61) & 5 == 4 or (v >> 61) & 2)
    import torch

    flags = (torch.frombuffer(buf, dtype=torch.int64) >> 61) & 7
    written = ((flags & 5) == 4) | ((flags & 2) != 0)
    return int(written.sum())


def entries():
    """The entries of the index now (tests, diagnostics)."""
    return list(index[1])
