package readahead

import (
	"fmt"

	"github.com/gdsfs/gdsfs/internal/units"
)

// Options are the read-ahead and trace keys of the staging section of
// config.yaml (staging.readahead_files, ...); errors name those keys.
type Options struct {
	// Files is the files planned at once, shared among the directories
	// that predict (0: read-ahead off). It is a floor, not a ceiling: a
	// directory whose readers follow name order together, spread over more
	// files than its share (DataLoader workers), gets as many, up to a
	// quarter of the directory and MaxFiles in all. Bytes still bounds
	// them all.
	Files int `yaml:"readahead_files"`
	// Bytes bounds their sizes added up. A file larger than Bytes is
	// never read ahead.
	Bytes units.Size `yaml:"readahead_bytes"`
	// TraceEntries bounds the access trace (0: no trace is recorded).
	TraceEntries int `yaml:"trace_entries"`
	// Replay names a trace file staged, in its order, at mount ("": none).
	Replay string `yaml:"replay"`
}

// Defaults: 4 files, 8GiB, no trace, no replay. INTEGRATION.md says why.
func Defaults() Options {
	return Options{Files: 4, Bytes: 8 << 30}
}

// Largest values Validate accepts.
const (
	MaxFiles        = 256
	MaxTraceEntries = 1 << 22
)

// Validate checks o, naming the key at fault.
func (o Options) Validate() error {
	switch {
	case o.Files < 0 || o.Files > MaxFiles:
		return fmt.Errorf("staging.readahead_files: %d is outside 0..%d (0 turns read-ahead off)", o.Files, MaxFiles)
	case o.Bytes < 0:
		return fmt.Errorf("staging.readahead_bytes: negative")
	case o.Files > 0 && o.Bytes == 0:
		return fmt.Errorf("staging.readahead_bytes: 0 while staging.readahead_files is %d; set readahead_files: 0 to turn read-ahead off", o.Files)
	case o.TraceEntries < 0 || o.TraceEntries > MaxTraceEntries:
		return fmt.Errorf("staging.trace_entries: %d is outside 0..%d (0 records no trace)", o.TraceEntries, MaxTraceEntries)
	}
	return nil
}

// Tuning holds the detector's constants. They are not configuration keys:
// the defaults are what the tests and INTEGRATION.md argue for; zero
// fields take them.
type Tuning struct {
	// Slack sets how far the readers of one sequence may spread (at
	// most Slack, and a sixteenth of the directory; see limits): new
	// positions up to 4×slack beyond the first not accessed yet, re-opens
	// up to 2×slack before it. Anything else is a jump that restarts the
	// sequence.
	Slack int
	// MinRun: a sequence predicts once its first MinRun+1 positions
	// were all accessed, with no jump between them.
	MinRun int
	// History is the number of accesses remembered per directory for
	// "an order seen before" (a trace learnt counts too).
	History int
	// Dirs is the number of directories tracked; the least recently
	// accessed is forgotten first.
	Dirs int
	// Idle: a directory whose last access is more than Idle accesses
	// (anywhere) ago stops predicting and gives up its window.
	Idle int
}

// DefaultTuning returns the constants used when a field is zero.
func DefaultTuning() Tuning {
	return Tuning{Slack: 8, MinRun: 3, History: 8192, Dirs: 256, Idle: 1024}
}

func (t Tuning) withDefaults() Tuning {
	d := DefaultTuning()
	if t.Slack <= 0 {
		t.Slack = d.Slack
	}
	if t.MinRun <= 0 {
		t.MinRun = d.MinRun
	}
	if t.History <= 0 {
		t.History = d.History
	}
	if t.Dirs <= 0 {
		t.Dirs = d.Dirs
	}
	if t.Idle <= 0 {
		t.Idle = d.Idle
	}
	return t
}
