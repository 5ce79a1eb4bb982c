// Package cuda is the CUDA backend of gpu.Device: staged files live in GPU
// memory allocated with the driver's virtual memory management API
// (cuMemCreate chunks mapped into one reserved range), so each file can be
// exported to consumers as POSIX file descriptors and mapped zero-copy in
// their processes (client/chunkmap maps them). Host bytes reach the GPU
// through pinned bounce buffers on per-worker streams; cuFile (GPUDirect
// Storage, or its compat mode) reads files straight into a Region. cuFile's own statistics
// (level 3, or CUFILE_STATS_LEVEL) are turned on when its driver opens, so
// its count of bytes and paths can be set beside gdsfs's (Attribute).
//
// The driver (libcuda.so.1) and cuFile (libcufile.so.0) are loaded at run
// time with dlopen by a small C shim (shim.c); no CUDA toolkit is needed to
// build, and the few driver types used are declared in shim.h, checked
// against the real headers by static asserts. Every shim call that touches
// device memory, a stream or cuFile makes the device's context current in
// the same C call, because goroutines move between OS threads.
//
// This package must never:
//   - be joined by cgo anywhere else in gdsfs (it is the only cgo package);
//   - crash or exit when a library, symbol or device is missing: every such
//     case is an error value naming what was missing;
//   - hand Go memory to the driver for asynchronous use: bounce buffers come
//     from cuMemHostAlloc.
package cuda
