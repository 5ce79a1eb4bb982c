// Package daemon is one gdsfs mount's life and what talks to it from the
// command line.
//
// The daemon side: Request.Run loads the configuration (daemon/config),
// opens the devices, starts the cache (staging), the lease server (ipc),
// the metrics endpoint and the FUSE server (fs), wires them together, and
// serves until unmounted or stopped by a signal (a graceful drain, then a
// lazy unmount). It detaches with --daemon (the starter waits for the
// report on a pipe), tells systemd READY=1 and STOPPING=1, reopens
// log.file on SIGHUP, and clears a dead mount its killed predecessor
// left. The files of MOUNTPOINT/.gdsfs/ are its control catalogue
// (controls.go).
//
// The client side: Stats and WatchStats read a mount's stats, Warmup and
// WarmupTrace stage files through its control files and wait on its lease
// socket, UnmountIfDead clears a mount whose daemon is gone.
//
// cmd/gdsfs maps flags onto these calls and holds no daemon logic. This
// package never parses command lines and never exits the process: errors
// carry their exit status (UsageError, ReportedError, ExitCode).
package daemon
