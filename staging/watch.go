package staging

import (
	"os"

	"go.uber.org/zap"

	"github.com/gdsfs/gdsfs/staging/watch"
)

// Change detection (staging.watch).
const (
	WatchAuto       = watch.Auto
	WatchTimestamps = watch.Timestamps
)

// fid names a file the way fanotify reports it.
type fid = watch.FID

// watcher is the cache's view of the change watcher (staging/watch): it
// hears of every file modified.
type watcher struct{ w *watch.Watcher }

// newWatcher starts change detection; onChange is called with the
// watcher's reading lock held, for each modified file, onLost when events
// were lost.
func newWatcher(mode string, log *zap.Logger, onChange func(fid), onLost func()) *watcher {
	w := watch.New(mode, log)
	w.Subscribe(watch.Subscriber{Modified: onChange, Lost: onLost})
	return &watcher{w: w}
}

func (w *watcher) probe(f *os.File, dev uint64) (fid, bool, string) { return w.w.Probe(f, dev) }
func (w *watcher) drain()                                           { w.w.Drain() }
func (w *watcher) close()                                           { w.w.Close() }
func (w *watcher) mode(dev uint64) string                           { return w.w.Mode(dev) }

// Watcher is the cache's change watcher, for other subscribers (the
// mount's entries and attributes).
func (c *Cache) Watcher() *watch.Watcher { return c.watch.w }
