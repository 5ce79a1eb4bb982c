package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/cuda"
)

// platformReport is what `gdsfs check` says about this machine.
type platformReport struct {
	Kernel      string      `json:"kernel"`
	DevFuse     string      `json:"dev_fuse"`
	Root        bool        `json:"root"`
	Fusermount  string      `json:"fusermount"`
	Passthrough string      `json:"fuse_passthrough"`
	CUDA        cuda.Report `json:"cuda"`
	CuFileDir   string      `json:"cufile_dir,omitempty"`
	CuFileFile  string      `json:"cufile_register,omitempty"`
	Staging     string      `json:"staging_device_auto"`
}

func checkCmd() *cobra.Command {
	var asJSON bool
	var dir string
	c := &cobra.Command{
		Use:   "check [--json] [--dir DIR]",
		Short: "Report what this machine offers gdsfs: FUSE, passthrough, CUDA, cuFile",
		Long: `Like gdscheck.py: the kernel's FUSE and passthrough support, the CUDA driver
and devices, libcufile and its mode, which device staging.device=auto would
pick, and with --dir whether cuFile registers a file there (so the cuFile
path would be taken for files on that filesystem).`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := checkPlatform(dir)
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(r)
			}
			fmt.Printf("kernel            %s\n", r.Kernel)
			fmt.Printf("/dev/fuse         %s\n", r.DevFuse)
			fmt.Printf("root              %v\n", r.Root)
			fmt.Printf("fusermount        %s\n", r.Fusermount)
			fmt.Printf("fuse passthrough  %s\n", r.Passthrough)
			fmt.Printf("staging (auto)    %s\n", r.Staging)
			if r.CuFileDir != "" {
				fmt.Printf("cuFile in %s  %s\n", r.CuFileDir, r.CuFileFile)
			}
			fmt.Print(r.CUDA.String())
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().StringVar(&dir, "dir", "", "directory in which to try registering a file with cuFile")
	return c
}

func checkPlatform(dir string) platformReport {
	var r platformReport
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	r.DevFuse = "present"
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		r.DevFuse = "unusable: " + err.Error()
	} else {
		f.Close()
	}
	r.Root = os.Geteuid() == 0
	r.Fusermount = "not found (mounting needs root)"
	for _, name := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(name); err == nil {
			r.Fusermount = p
			break
		}
	}
	r.Passthrough = passthroughSupport(r.Kernel, r.Root)
	r.CUDA = cuda.Check()
	r.Staging = "host (" + firstLine(r.CUDA.Error) + ")"
	if r.CUDA.Error == "" && r.CUDA.DeviceCount > 0 {
		r.Staging = "cuda: " + r.CUDA.Devices[0].UUID
	}
	if dir != "" {
		r.CuFileDir, r.CuFileFile = dir, tryCuFile(dir)
	}
	return r
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// passthroughSupport says whether FUSE passthrough can work: Linux >= 6.9
// and CAP_SYS_ADMIN (a mount settles it for sure; see stats "passthrough").
func passthroughSupport(kernel string, root bool) string {
	var major, minor int
	fmt.Sscanf(kernel, "%d.%d", &major, &minor)
	switch {
	case major < 6 || (major == 6 && minor < 9):
		return "no: kernel " + kernel + " < 6.9"
	case !root:
		return "no: needs root (CAP_SYS_ADMIN)"
	default:
		return "yes (kernel " + kernel + ", root)"
	}
}

// tryCuFile registers a temporary file in dir with cuFile.
func tryCuFile(dir string) string {
	d, err := cuda.Open(0, gpu.Options{}, nil)
	if err != nil {
		return "no GPU: " + err.Error()
	}
	defer d.Close()
	cf, why := d.CuFile()
	if cf == nil {
		return "cuFile unavailable: " + why
	}
	f, err := os.CreateTemp(dir, ".gdsfs-check-")
	if err != nil {
		return err.Error()
	}
	defer os.Remove(f.Name())
	defer f.Close()
	f.Write(make([]byte, 4096))
	h, err := cf.Register(int(f.Fd()))
	if err != nil {
		return "refused: " + err.Error()
	}
	h.Close()
	return "registers (" + cf.Mode() + " mode)"
}
