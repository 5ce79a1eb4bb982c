package proto

import (
	"fmt"
	"strings"
)

// Version is the protocol version PROTOCOL.md describes. Additions a peer
// may ignore (a new answer field, a new op) keep it; a change of meaning
// raises it.
const Version = 1

// Limits.
const (
	// MaxFDs is the kernel's limit of descriptors in one SCM_RIGHTS
	// message (SCM_MAX_FD). An answer with more sends them in several.
	MaxFDs = 253
	// MaxBatch is the most paths one acquire_many may name.
	MaxBatch = 1024
	// MaxPath is the longest path a request may name (PATH_MAX).
	MaxPath = 4096
	// MaxReason is the longest reason a report may carry.
	MaxReason = 64
	// MaxAnswer is the longest answer line a client accepts.
	MaxAnswer = 16 << 20
	// MaxWaitMS is the longest timeout_ms a wait or wait_stat may ask
	// (an hour); a client that wants longer asks again.
	MaxWaitMS = 3600 * 1000
)

// Operations.
const (
	OpHello       = "hello"
	OpAcquire     = "acquire"
	OpAcquireMany = "acquire_many"
	OpRelease     = "release"
	OpDrop        = "drop"
	OpStat        = "stat"
	OpReport      = "report"
	OpWait        = "wait"
	OpWaitStat    = "wait_stat"
)

// Ops lists the operations of this version, as hello answers them.
var Ops = []string{OpAcquire, OpAcquireMany, OpDrop, OpHello, OpRelease, OpReport, OpStat, OpWait, OpWaitStat}

// A file's states, as stat and wait answer them (a failed one is
// "failed: REASON"). A file queued for staging reads as loading.
const (
	StateAbsent   = "absent"
	StateLoading  = "loading"
	StateResident = "resident"
	StateFailed   = "failed"
)

// WaitStates are the states a wait may name in until: the ends of a
// staging (loading is what a wait waits through).
var WaitStates = []string{StateAbsent, StateFailed, StateResident}

// The daemon's lease counters a wait_stat may name: the stats.json keys
// the lease server owns (ipc_open_connections counts the connections other
// than the one asking).
const (
	StatOpenConnections    = "ipc_open_connections"
	StatLeasesActive       = "leases_active"
	StatHeldBytes          = "lease_held_bytes"
	StatHeldFiles          = "lease_held_files"
	StatHoldingConnections = "lease_holding_connections"
)

// WaitStatKeys lists the keys wait_stat accepts.
var WaitStatKeys = []string{StatHeldBytes, StatHeldFiles, StatHoldingConnections, StatLeasesActive, StatOpenConnections}

// EventFallback is the one report event of this version: a client served a
// load some other way than by a lease (the autoloader's fallback).
const EventFallback = "fallback"

// Sharing modes, as answered in Grant.Sharing.
const (
	SharingShared  = "shared"
	SharingPrivate = "private"
)

// DeviceHost is Grant.Device for the host backend (memfds); a GPU is
// "GPU-<uuid>". A daemon with several host devices (staging.host_devices)
// names them "host0", "host1", ...: IsHost tells them all.
const DeviceHost = "host"

// IsHost says whether a grant's device is host memory ("host", "hostN").
func IsHost(device string) bool {
	rest, ok := strings.CutPrefix(device, DeviceHost)
	if !ok {
		return false
	}
	for _, c := range []byte(rest) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Request is one line a client sends. Which fields an op takes is checked
// by Check; unknown fields are refused (EINVAL), so a client learns that a
// daemon did not understand it.
type Request struct {
	Op string `json:"op"`
	// acquire, stat: the file, relative to the mount (a leading "/" and
	// the mount point itself are accepted and stripped).
	Path string `json:"path,omitempty"`
	// acquire_many: the files, in order.
	Paths []string `json:"paths,omitempty"`
	// acquire, acquire_many: the device the client runs on ("GPU-<uuid>",
	// "host", "hostN", or an ordinal of the daemon's staging.gpus): the
	// lease is of the replica there where the daemon's placement allows
	// (a preference: a device the daemon does not stage onto is served as
	// if none was named); "" or absent: none.
	Device string `json:"device,omitempty"`
	// acquire: the generation the client has mapped from an earlier answer
	// on this connection (the repeat-lease fast path); 0 or absent: none.
	Generation uint64 `json:"generation,omitempty"`
	// acquire_many: Generation per path (0 where none), or absent.
	Generations []uint64 `json:"generations,omitempty"`
	// acquire, acquire_many: the longest the daemon may wait for room
	// (capacity held by leases or loads, or the uid's
	// ipc.max_held_per_uid) before answering ENOSPC or EDQUOT, 1 to
	// MaxWaitMS; the daemon clamps it to ipc.acquire_timeout, which still
	// bounds the whole acquire. 0 or absent: ipc.acquire_timeout alone.
	RoomWaitMS int64 `json:"room_wait_ms,omitempty"`
	// acquire, acquire_many: grant only a file resident now where the
	// grant would come from; one that is not is answered ENODATA and
	// nothing is staged, copied or waited for.
	Resident bool `json:"resident,omitempty"`
	// acquire, acquire_many: each grant also carries the identity of the
	// file leased (Grant.Identity).
	Identity bool `json:"identity,omitempty"`
	// release: the lease id and the epoch it was granted in.
	Lease uint64 `json:"lease,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	// report: what happened and why.
	Event  string `json:"event,omitempty"`
	Reason string `json:"reason,omitempty"`
	// hello: the highest version the client speaks, and the client's
	// release ("0.2.0"), which asks the daemon to answer its own.
	Version int    `json:"version,omitempty"`
	Release string `json:"release,omitempty"`
	// wait: the states that end the wait (some of WaitStates).
	Until []string `json:"until,omitempty"`
	// wait_stat: the counter (one of WaitStatKeys) and the value it must
	// reach (a pointer: 0 is a value to wait for).
	Key   string `json:"key,omitempty"`
	Value *int64 `json:"value,omitempty"`
	// wait, wait_stat: how long to wait at most, 1 to MaxWaitMS.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// Chunk describes one descriptor of a grant, in order.
type Chunk struct {
	Len int64 `json:"len"`
}

// Grant is one leased file: the fields of an acquire answer, and of each
// item of an acquire_many answer.
type Grant struct {
	Lease      uint64 `json:"lease,omitempty"`
	Size       int64  `json:"size,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Device     string `json:"device,omitempty"`
	Sharing    string `json:"sharing,omitempty"`
	// Chunks are the descriptors sent with the answer, in order; absent
	// when Reuse is set.
	Chunks []Chunk `json:"chunks,omitempty"`
	// Cache: the client may keep the mapping (and this connection) after
	// releasing the lease, for a repeat acquire with Generation.
	Cache bool `json:"cache,omitempty"`
	// Reuse: the generation the request named is current and this
	// connection holds it; no descriptors are sent, the client maps what
	// it kept.
	Reuse bool `json:"reuse,omitempty"`
	// Identity is the file whose bytes the grant holds, as the mount
	// shows it; only where the request asked for it (Request.Identity)
	// and the mount knows the file's inode number.
	Identity *FileIdentity `json:"identity,omitempty"`
}

// FileIdentity tells one version of a file: a stat of its path through
// the mount gives these values while the path names that version.
type FileIdentity struct {
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

// FDs is how many descriptors ride with g.
func (g *Grant) FDs() int {
	if g.Reuse {
		return 0
	}
	return len(g.Chunks)
}

// ChunkLens returns the chunk lengths.
func (g *Grant) ChunkLens() []int64 {
	out := make([]int64, len(g.Chunks))
	for i, c := range g.Chunks {
		out[i] = c.Len
	}
	return out
}

// Item is one file of an acquire_many answer.
type Item struct {
	OK    bool   `json:"ok"`
	Errno string `json:"errno,omitempty"`
	Error string `json:"error,omitempty"`
	Grant
}

// Err is the item's error, or nil when it is OK.
func (it *Item) Err() error {
	if it.OK {
		return nil
	}
	return &Error{Code: ParseErrno(it.Errno), Msg: it.Error}
}

// Response is one line the daemon answers. Epoch identifies the daemon
// instance: a lease from another epoch ended with its daemon.
type Response struct {
	OK    bool   `json:"ok"`
	Epoch uint64 `json:"epoch"`
	Errno string `json:"errno,omitempty"` // "EACCES", "ENOENT", ...
	Error string `json:"error,omitempty"`
	// acquire (and stat's Size)
	Grant
	// acquire_many
	Files []Item `json:"files,omitempty"`
	// stat, wait
	State    string `json:"state,omitempty"`
	LoadPath string `json:"load_path,omitempty"`
	// stat, wait: why the file is absent, where the daemon knows
	// ("evicted", "not staged: ...", "changed", ...)
	Why string `json:"why,omitempty"`
	// hello. Release is the daemon's release ("0.2.0", "+build" where it
	// has one), answered when the request carries its own release.
	Version int      `json:"version,omitempty"`
	Release string   `json:"release,omitempty"`
	Ops     []string `json:"ops,omitempty"`
	MaxFDs  int      `json:"max_fds,omitempty"`
	// Devices names the devices the daemon stages onto ("GPU-<uuid>",
	// "host", "hostN"): a client learns whether a mount's files go to GPU
	// memory without leasing one.
	Devices []string `json:"devices,omitempty"`
}

// Err is the answer's error, or nil when it is OK.
func (r *Response) Err() error {
	if r.OK {
		return nil
	}
	return &Error{Code: ParseErrno(r.Errno), Msg: r.Error}
}

// FDs is how many descriptors ride with r.
func (r *Response) FDs() int {
	if !r.OK {
		return 0
	}
	n := r.Grant.FDs()
	for i := range r.Files {
		if r.Files[i].OK {
			n += r.Files[i].FDs()
		}
	}
	return n
}

// Check validates r's fields for its op: EINVAL errors that say what is
// wrong. An unknown op is an error too.
func (r *Request) Check() error {
	bad := func(format string, a ...any) error {
		return Errorf(EINVAL, "%s: "+format, append([]any{r.Op}, a...)...)
	}
	has := map[string]bool{
		"path": r.Path != "", "paths": r.Paths != nil, "generation": r.Generation != 0, "device": r.Device != "",
		"generations": r.Generations != nil, "lease": r.Lease != 0, "epoch": r.Epoch != 0,
		"event": r.Event != "", "reason": r.Reason != "", "version": r.Version != 0, "release": r.Release != "",
		"until": r.Until != nil, "key": r.Key != "", "value": r.Value != nil, "timeout_ms": r.TimeoutMS != 0,
		"room_wait_ms": r.RoomWaitMS != 0, "resident": r.Resident, "identity": r.Identity,
	}
	allowed := map[string][]string{
		OpHello:       {"version", "release"},
		OpAcquire:     {"path", "generation", "device", "room_wait_ms", "resident", "identity"},
		OpAcquireMany: {"paths", "generations", "device", "room_wait_ms", "resident", "identity"},
		OpRelease:     {"lease", "epoch"},
		OpDrop:        {"generation", "device"},
		OpStat:        {"path"},
		OpReport:      {"event", "reason"},
		OpWait:        {"path", "until", "timeout_ms"},
		OpWaitStat:    {"key", "value", "timeout_ms"},
	}
	fields, ok := allowed[r.Op]
	if !ok {
		return Errorf(EINVAL, "unknown op %q (want one of %v)", r.Op, Ops)
	}
	for k, set := range has {
		if set && !contains(fields, k) {
			return bad("field %q does not belong to this op", k)
		}
	}
	if err := checkDevice(r.Device); err != nil {
		return bad("%v", err)
	}
	if r.RoomWaitMS < 0 || r.RoomWaitMS > MaxWaitMS {
		return bad("room_wait_ms %d; want 1 to %d (or absent)", r.RoomWaitMS, MaxWaitMS)
	}
	switch r.Op {
	case OpAcquire, OpStat:
		return checkPath(r.Op, r.Path)
	case OpWait, OpWaitStat:
		return r.checkWait()
	case OpAcquireMany:
		if len(r.Paths) == 0 || len(r.Paths) > MaxBatch {
			return bad("%d paths; want 1 to %d", len(r.Paths), MaxBatch)
		}
		if r.Generations != nil && len(r.Generations) != len(r.Paths) {
			return bad("%d generations for %d paths", len(r.Generations), len(r.Paths))
		}
		for _, p := range r.Paths {
			if err := checkPath(r.Op, p); err != nil {
				return err
			}
		}
	case OpRelease:
		if r.Lease == 0 {
			return bad("no lease id")
		}
	case OpDrop:
		if r.Generation == 0 || r.Device == "" {
			return bad("want the generation and device of a grant on this connection")
		}
	case OpReport:
		if r.Event != EventFallback {
			return bad("event %q is not one of [%s]", r.Event, EventFallback)
		}
		if err := checkReason(r.Reason); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// checkWait checks a wait's or wait_stat's fields.
func (r *Request) checkWait() error {
	bad := func(format string, a ...any) error {
		return Errorf(EINVAL, "%s: "+format, append([]any{r.Op}, a...)...)
	}
	if r.TimeoutMS < 1 || r.TimeoutMS > MaxWaitMS {
		return bad("timeout_ms %d; want 1 to %d", r.TimeoutMS, MaxWaitMS)
	}
	if r.Op == OpWaitStat {
		switch {
		case !contains(WaitStatKeys, r.Key):
			return bad("key %q is not one of %v", r.Key, WaitStatKeys)
		case r.Value == nil || *r.Value < 0:
			return bad("value: want a number, 0 or more")
		}
		return nil
	}
	if len(r.Until) == 0 {
		return bad("until: name at least one of %v", WaitStates)
	}
	for _, s := range r.Until {
		if !contains(WaitStates, s) {
			return bad("until: %q is not one of %v", s, WaitStates)
		}
	}
	return checkPath(r.Op, r.Path)
}

// StateIn reports whether state (as stat answers it: "failed: REASON" is
// failed) is one of states.
func StateIn(state string, states []string) bool {
	if strings.HasPrefix(state, StateFailed+":") {
		state = StateFailed
	}
	return contains(states, state)
}

func checkPath(op, p string) error {
	switch {
	case p == "":
		return Errorf(EINVAL, "%s: no path", op)
	case len(p) > MaxPath:
		return Errorf(ENAMETOOLONG, "%s: path of %d bytes, more than %d", op, len(p), MaxPath)
	}
	for i := 0; i < len(p); i++ {
		if p[i] == 0 {
			return Errorf(EINVAL, "%s: a NUL byte in path %q", op, p)
		}
	}
	if HasDotDot(p) {
		// Read as text it would undo the name before it, a link's too,
		// where the kernel's walk goes up from the link's target.
		return Errorf(EINVAL, "%s: path %q has a `..` component: send the path the kernel's walk of it reaches (links resolved)", op, p)
	}
	return nil
}

// HasDotDot reports whether path has a `..` component.
func HasDotDot(path string) bool {
	for _, c := range strings.Split(path, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// MaxDevice is the longest device a request may name.
const MaxDevice = 128

// checkDevice accepts "" or up to MaxDevice bytes of [A-Za-z0-9-]
// ("GPU-<uuid>", "MIG-<uuid>", "host1", "0").
func checkDevice(s string) error {
	if len(s) > MaxDevice {
		return fmt.Errorf("device of %d bytes; want at most %d", len(s), MaxDevice)
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("device %q: only letters, digits and - are allowed (GPU-<uuid>, hostN, or an ordinal)", s)
		}
	}
	return nil
}

// checkReason accepts 1 to MaxReason bytes of [A-Za-z0-9._:-].
func checkReason(s string) error {
	if s == "" || len(s) > MaxReason {
		return fmt.Errorf("reason of %d bytes; want 1 to %d", len(s), MaxReason)
	}
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return fmt.Errorf("reason %q: only letters, digits and . _ : - are allowed", s)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
