package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gdsfs/gdsfs/internal/mountinfo"
)

func umountCmd() *cobra.Command {
	var lazy, ifDead bool
	c := &cobra.Command{
		Use:   "umount [--lazy | --if-dead] MOUNTPOINT",
		Short: "Unmount a gdsfs mount; a busy mount is reported with the processes using it",
		Long: `Unmounts the gdsfs mount on MOUNTPOINT.

--if-dead unmounts only a gdsfs mount whose daemon is gone (its accesses fail
with ENOTCONN, "transport endpoint is not connected"), lazily if it is busy; a
mount a daemon serves, another filesystem, or nothing mounted is left alone and
the command exits 0. It is what a service manager runs after a daemon stops:
it never takes a live mount from another daemon.`,
		Args: exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, err := filepath.Abs(args[0])
			if err != nil {
				return err
			}
			if ifDead {
				_, err := unmountIfDead(mnt, cmd.ErrOrStderr())
				return err
			}
			return mountinfo.Unmount(mnt, lazy)
		},
	}
	c.Flags().BoolVar(&lazy, "lazy", false, "detach now; the mount goes when its last file closes")
	c.Flags().BoolVar(&ifDead, "if-dead", false, "only a gdsfs mount whose daemon is gone; leave a live one alone")
	c.MarkFlagsMutuallyExclusive("lazy", "if-dead")
	return c
}

// unmountIfDead unmounts the gdsfs mount on mnt (absolute) if its daemon
// is gone (mountAt), and says on w what it did.
func unmountIfDead(mnt string, w io.Writer) (unmounted bool, err error) {
	fstype, mounted, dead := mountAt(mnt)
	switch {
	case !mounted:
		fmt.Fprintf(w, "gdsfs: %s: not a mount point; nothing to do\n", mnt)
		return false, nil
	case fstype != "fuse.gdsfs":
		fmt.Fprintf(w, "gdsfs: %s: a %s mount, not gdsfs; left alone\n", mnt, fstype)
		return false, nil
	case !dead:
		fmt.Fprintf(w, "gdsfs: %s: served by a live daemon; left alone\n", mnt)
		return false, nil
	}
	busy, err := unmountDead(mnt)
	switch {
	case err != nil:
		return false, fmt.Errorf("%s: a dead gdsfs mount that cannot be unmounted: %w", mnt, err)
	case busy != nil:
		fmt.Fprintf(w, "gdsfs: %s: a dead gdsfs mount (its daemon is gone), busy: detached it lazily\n", mnt)
	default:
		fmt.Fprintf(w, "gdsfs: %s: a dead gdsfs mount (its daemon is gone): unmounted it\n", mnt)
	}
	return true, nil
}
