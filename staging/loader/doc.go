// Package loader reads a file's bytes into a device region: on the cuFile
// path or the POSIX path (pread into two pinned bounce buffers per worker,
// overlapping the copy to the device), buffered or with O_DIRECT, at
// demand or background priority; and copies a range device to device
// between peers. It sizes its workers by a measured rule (autotune.go).
//
// A Loader is one device's workers. Load takes a Request (the file's
// descriptors, its size, the span to read, the region to fill, the
// options) and returns a Result: the path taken and, when that is not
// cuFile although cuFile exists, why.
//
// It must never see the cache: it knows nothing of entries, states,
// capacity or leases, and takes no lock of the cache. Its one lock,
// Loader.mu, is a leaf. Every goroutine it starts stops when its
// context ends; Close waits for them.
package loader
