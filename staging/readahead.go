package staging

// Read-ahead across files: staging/triggers/readahead plans it (the
// Runner, which the cache keeps: opens through the mount and leases feed
// its detector, Opened and Acquire, and it keeps the clock that stamps
// entries, the access trace and the replay), and its Executor, wired in
// through Config.ReadAhead, carries out the plans through the cache's API
// for background loads (background.go).

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging/triggers"
	"github.com/gdsfs/gdsfs/staging/triggers/readahead"
)

// ReadAhead carries out the read-ahead planner's Plans
// (staging/triggers/readahead.Executor, wired in through
// Config.ReadAhead).
type ReadAhead interface {
	// Attach hands it the cache's API for background loads and the
	// runner whose Plans it carries out; New calls it once, first.
	Attach(core triggers.Core, runner *readahead.Runner)
	// Run carries out the Plans until ctx is done; New runs it on a
	// goroutine Close waits for.
	Run(ctx context.Context)
}

// newRunner makes the detector and its runner for cfg; directories are
// listed beneath root as the daemon.
func newRunner(cfg Config, root *access.Root, log *zap.Logger) *readahead.Runner {
	ra := readahead.New(readahead.Config{Options: cfg.Options.ReadAhead(), List: readahead.ListBeneath(root), Log: log})
	return readahead.NewRunner(ra, readahead.NewRecorder(cfg.Options.TraceEntries))
}

// readTrace reads staging.replay's trace (nil when none is set).
func readTrace(cfg Config) (*readahead.Trace, error) {
	if cfg.Options.Replay == "" {
		return nil, nil
	}
	t, err := readahead.ReadTraceFile(cfg.Options.Replay)
	if err != nil {
		return nil, fmt.Errorf("staging.replay: %w", err)
	}
	if t.Source != "" && cfg.Source != "" && t.Source != cfg.Source && cfg.Log != nil {
		cfg.Log.Warn("staging.replay: the trace was recorded over another SOURCE; its paths are taken relative to this one",
			zap.String("trace", cfg.Options.Replay), zap.String("trace_source", t.Source), zap.String("source", cfg.Source))
	}
	return t, nil
}

// startReadAhead starts the executor (unless a test drives it) and the
// replay of staging.replay's trace. Without an executor the runner still
// runs: it feeds the planner what opens, leases, replays and changes
// push (the queue of accesses drained, so none is dropped for want of
// room while it keeps up, and no event piles up), and its Plans are
// dropped (unexecuted).
func (c *Cache) startReadAhead(cfg Config, replay *readahead.Trace) {
	c.raExec = cfg.ReadAhead
	x := cfg.ReadAhead
	if x != nil {
		x.Attach(c, c.ra)
	}
	if !cfg.manualReadAhead {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if x != nil {
				x.Run(c.ctx)
			} else {
				c.ra.Run(c.ctx, c.unexecuted)
			}
		}()
	}
	if replay != nil && len(replay.Paths) > 0 {
		c.log.Info("replaying a trace", zap.String("trace", cfg.Options.Replay), zap.Int("paths", len(replay.Paths)))
		c.ra.Replay(replay.Paths)
	}
}

// unexecuted is what becomes of a Plan without an executor
// (Config.ReadAhead nil): nothing; the test hook hears it.
func (c *Cache) unexecuted(p readahead.Plan) {
	if c.hooks.unexecuted != nil {
		c.hooks.unexecuted(p)
	}
}

// Replay stages rels in their order through the read-ahead window (a
// trace written to .gdsfs/replay, or staging.replay). It never blocks.
func (c *Cache) Replay(rels []string) { c.ra.Replay(rels) }

// Source is the directory files are staged from (SOURCE).
func (c *Cache) Source() string { return c.root.Path() }

// Trace is the access trace; nil when staging.trace_entries is 0.
func (c *Cache) Trace() *readahead.Recorder { return c.ra.Trace() }
