package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gdsfs/gdsfs/internal/control"
	"github.com/gdsfs/gdsfs/internal/mountinfo"
	"github.com/gdsfs/gdsfs/internal/readahead"
)

// WarmupTrace writes the paths of the trace in file to the mount's
// .gdsfs/replay, one write each (a path the caller may not read fails
// alone), then with wait waits for them as Warmup does. The mount is
// mountpoint, else ("") the trace's "# mount:".
func WarmupTrace(file, mountpoint string, wait bool, timeout time.Duration) error {
	t, err := readahead.ReadTraceFile(file)
	if err != nil {
		return UsageError{fmt.Errorf("warmup --trace: %w", err)}
	}
	mnt, err := traceMount(file, t, mountpoint)
	if err != nil {
		return err
	}
	ctl, err := control.OpenWriter(filepath.Join(mnt, ".gdsfs", "replay"))
	if err != nil {
		return fmt.Errorf("warmup --trace: %s: %w", mnt, err)
	}
	files, failed := replayPaths(ctl, mnt, t.Paths)
	if err := ctl.Close(); err != nil {
		return fmt.Errorf("warmup --trace: %s: %w", mnt, err)
	}
	if len(failed) > 0 {
		return fmt.Errorf("warmup --trace: %d of %d paths not replayed: %s", len(failed), len(t.Paths), strings.Join(failed, "; "))
	}
	if !wait {
		fmt.Fprintf(os.Stderr, "replaying %d files in the trace's order\n", len(files))
		return nil
	}
	return waitStaged(files, timeout)
}

// traceMount is MOUNTPOINT, else the trace's "# mount:"; it must be a
// gdsfs mount point.
func traceMount(file string, t *readahead.Trace, mountpoint string) (string, error) {
	mnt := t.Mount
	if mountpoint != "" {
		mnt = mountpoint
	}
	if mnt == "" {
		return "", UsageError{fmt.Errorf("warmup --trace: %s names no mount (no \"# mount:\" line); give MOUNTPOINT", file)}
	}
	root, rel, err := mountinfo.Root(mnt)
	if err != nil || rel != "." {
		return "", UsageError{fmt.Errorf("warmup --trace: %s is not a gdsfs mount point (the trace %s was recorded on %q)", mnt, file, t.Mount)}
	}
	return root, nil
}

// replayPaths writes each path to ctl (.gdsfs/replay) in its own write.
// It returns the files written and, for each path that failed, why.
func replayPaths(ctl *os.File, mnt string, paths []string) (files []warmFile, failed []string) {
	for _, p := range paths {
		if strings.ContainsAny(p, "\n\r") || strings.TrimSpace(p) != p {
			failed = append(failed, fmt.Sprintf("%q: a control file takes one path per line, without surrounding white space", p))
			continue
		}
		if _, err := ctl.WriteString(p + "\n"); err != nil {
			failed = append(failed, p+": "+unwrapSyscall(err).Error())
			continue
		}
		f := warmFile{path: filepath.Join(mnt, p), mnt: mnt, rel: p}
		if st, err := os.Stat(f.path); err == nil {
			f.size = st.Size()
		}
		files = append(files, f)
	}
	return files, failed
}
