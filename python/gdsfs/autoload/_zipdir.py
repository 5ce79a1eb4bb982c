"""Where each record of a torch.save zip archive lies, from the zip
central directory (zip64 included) read out of the lease. torch.save stores
records uncompressed; anything else is refused with a reason."""

import io
import struct
import zipfile

_LOCAL = struct.Struct("<4s2B4HL2L2H")  # local file header, 30 bytes
_LOCAL_SIG = b"PK\x03\x04"


class ZipError(ValueError):
    def __init__(self, reason, detail=""):
        super().__init__("%s: %s" % (reason, detail) if detail else reason)
        self.reason = reason


class LeaseFile(io.RawIOBase):
    """A read-only file over lease.read(offset, n) (a device-to-host copy
    on a GPU lease), for zipfile to find the central directory."""

    def __init__(self, read, size):
        self._read = read
        self._size = size
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, off, whence=0):
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + off)
        return self._pos

    def readinto(self, b):
        n = max(0, min(len(b), self._size - self._pos))
        if n:
            b[:n] = self._read(self._pos, n)
            self._pos += n
        return n


class Record:
    __slots__ = ("name", "offset", "size", "header_offset")

    def __init__(self, name, offset, size, header_offset):
        self.name, self.offset, self.size, self.header_offset = name, offset, size, header_offset


def records(read, size):
    """{name without the archive's top directory: Record} of a torch.save
    archive of size bytes; read(offset, n) returns bytes."""
    try:
        zf = zipfile.ZipFile(io.BufferedReader(LeaseFile(read, size), 1 << 16))
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise ZipError("format:not-zip", str(e)) from None
    if not infos:
        raise ZipError("format:empty-zip")
    # torch's reader takes the central directory's offsets as they are
    # written; zipfile adds to them the bytes before the archive (another
    # archive written before it into the same file, or anything else), so
    # it would find records torch does not. torch.save's first record is
    # at byte 0: anything else is left to torch.
    first = min(i.header_offset for i in infos)
    if first != 0:
        raise ZipError("format:zip-prefix", "the first record is at byte %d, not 0" % first)
    top = infos[0].filename.split("/", 1)[0]
    out = {}
    for i in infos:
        if not i.filename.startswith(top + "/"):
            raise ZipError("format:zip-layout", "%s is outside %s/" % (i.filename, top))
        if i.compress_type != zipfile.ZIP_STORED or i.flag_bits & 0x1:
            raise ZipError("format:compressed", i.filename)
        if i.header_offset < 0 or i.header_offset + _LOCAL.size > size:
            raise ZipError("format:zip-offsets", i.filename)
        h = _LOCAL.unpack(read(i.header_offset, _LOCAL.size))
        if h[0] != _LOCAL_SIG:
            raise ZipError("format:zip-offsets", "no local header for %s" % i.filename)
        off = i.header_offset + _LOCAL.size + h[10] + h[11]
        if off + i.file_size > size:
            raise ZipError("format:zip-offsets", i.filename)
        out[i.filename[len(top) + 1:]] = Record(i.filename, off, i.file_size, i.header_offset)
    return out
