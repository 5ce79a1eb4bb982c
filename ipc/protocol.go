package ipc

// Request is one line a client sends.
//
//	{"op":"acquire","path":"rel/path"}          stage (waiting) and lease
//	{"op":"release","lease":N,"epoch":E}         end a lease
//	{"op":"stat","path":"rel/path"}              state without staging
type Request struct {
	Op    string `json:"op"`
	Path  string `json:"path,omitempty"`
	Lease uint64 `json:"lease,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
}

// Chunk describes one descriptor sent with an acquire answer, in order.
type Chunk struct {
	Len int64 `json:"len"`
}

// Response is one line the server answers. Epoch identifies the daemon
// instance: a lease from another epoch is gone.
type Response struct {
	OK    bool   `json:"ok"`
	Epoch uint64 `json:"epoch"`
	// Errors.
	Errno string `json:"errno,omitempty"` // "EACCES", "ENOENT", ...
	Error string `json:"error,omitempty"`
	// acquire
	Lease      uint64  `json:"lease,omitempty"`
	Size       int64   `json:"size,omitempty"`
	Generation uint64  `json:"generation,omitempty"`
	Device     string  `json:"device,omitempty"` // "GPU-<uuid>" or "host"
	Sharing    string  `json:"sharing,omitempty"`
	Chunks     []Chunk `json:"chunks,omitempty"`
	// stat
	State    string `json:"state,omitempty"`
	LoadPath string `json:"load_path,omitempty"`
}

// Operations.
const (
	OpAcquire = "acquire"
	OpRelease = "release"
	OpStat    = "stat"
)
