// Package watch tells its subscribers when files and directories of
// SOURCE change, from one fanotify group with a FAN_MARK_FILESYSTEM mark
// on each local filesystem SOURCE's files live on (FID mode: no
// descriptor is opened per event).
//
// Subscribers: the staging cache hears of every file modified (per file
// identity), the FUSE layer of every entry created, removed or renamed,
// every attribute changed, and every filesystem mounted or unmounted in
// the process's mount namespace (poll on /proc/self/mountinfo: a mount
// raises no fanotify event). Where a filesystem raises no events
// (network, FUSE and stacked filesystems, or mode "timestamps") the
// caller is told so and must not rely on events for it.
//
// It never opens a file of SOURCE by path and never blocks on a
// subscriber's work: callbacks run with the reading lock held and must
// only record what they were told.
package watch
