package watch

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Filesystems whose every modification passes through this kernel, so
// fanotify sees it. Network and FUSE filesystems (nfs, lustre, cifs,
// ceph, fuse, ...) and stacked ones (overlay: a write to a lower or upper
// directory bypasses the overlay's superblock) are not among them.
var localFS = map[int64]string{
	0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
	0xF2F52010: "f2fs", 0xca451a4e: "bcachefs", 0x858458f6: "ramfs",
}

var otherFS = map[int64]string{
	0x6969: "nfs", 0x65735546: "fuse", 0x0BD00BD0: "lustre", 0xFF534D42: "cifs",
	0xFE534D42: "smb2", 0x00c36400: "ceph", 0x794c7630: "overlay", 0x01021997: "9p",
	0x47504653: "gpfs", 0x2fc12fc1: "zfs", 0x5346414F: "afs",
}

// atHandleFID asks name_to_handle_at for the encoding fanotify reports
// (Linux 6.5); older kernels encode the same for the filesystems in
// localFS without it.
const atHandleFID = 0x200

// FileFID is the FID fanotify reports for the file fd refers to (an
// O_PATH descriptor will do) on the filesystem whose id is fsid (FSID).
func FileFID(fd int, fsid [8]byte) (FID, error) {
	h, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH|atHandleFID)
	if errors.Is(err, unix.EINVAL) {
		h, _, err = unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	}
	if err != nil {
		return "", fmt.Errorf("name_to_handle_at: %v", err)
	}
	b := make([]byte, 16, 16+h.Size())
	copy(b, fsid[:])
	binary.NativeEndian.PutUint32(b[8:], uint32(h.Size()))
	binary.NativeEndian.PutUint32(b[12:], uint32(h.Type()))
	return FID(append(b, h.Bytes()...)), nil
}

// FSID is the id fanotify reports for the filesystem fd's file lives on.
func FSID(fd int) ([8]byte, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return [8]byte{}, fmt.Errorf("fstatfs: %v", err)
	}
	return fsidOf(&sfs), nil
}

func fsidOf(sfs *unix.Statfs_t) (id [8]byte) {
	binary.NativeEndian.PutUint32(id[0:], uint32(sfs.Fsid.Val[0]))
	binary.NativeEndian.PutUint32(id[4:], uint32(sfs.Fsid.Val[1]))
	return id
}
