package access

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

var nobody = Cred{UID: 65534, GID: 65534}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: acting as another user needs root (run make test as root)")
	}
}

func write(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte("data"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func tree(t *testing.T) (*Root, string) {
	t.Helper()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	r, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dir
}

func TestOpenAsLetsTheKernelDecide(t *testing.T) {
	needRoot(t)
	r, dir := tree(t)
	write(t, filepath.Join(dir, "secret"), 0o600)
	write(t, filepath.Join(dir, "public"), 0o644)
	write(t, filepath.Join(dir, "group"), 0o640)
	os.Chown(filepath.Join(dir, "group"), 0, 4242)
	os.Mkdir(filepath.Join(dir, "closed"), 0o700)
	write(t, filepath.Join(dir, "closed/inside"), 0o644)
	member := Cred{UID: 65534, GID: 65534, Groups: []uint32{4242}}
	for _, tc := range []struct {
		rel  string
		cred Cred
		want error
	}{
		{"secret", nobody, syscall.EACCES},
		{"public", nobody, nil},
		{"group", nobody, syscall.EACCES},
		{"group", member, nil},
		{"closed/inside", nobody, syscall.EACCES}, // no search right on closed/
		{"secret", Daemon(), nil},
		{"secret", Cred{}, nil}, // uid 0 without capabilities: the owner
	} {
		f, err := r.OpenAs(tc.cred, tc.rel, os.O_RDONLY, 0, Beneath)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s as %v: %v, want %v", tc.rel, tc.cred, err, tc.want)
		}
		if f != nil {
			f.Close()
		}
	}
}

func TestACLsHonoured(t *testing.T) {
	needRoot(t)
	if _, err := exec.LookPath("setfacl"); err != nil {
		t.Fatalf("setfacl is not installed (.ci/run installs the acl package): %v", err)
	}
	r, dir := tree(t)
	denied := filepath.Join(dir, "denied")
	masked := filepath.Join(dir, "masked")
	write(t, denied, 0o644)
	write(t, masked, 0o640)
	os.Chown(masked, 0, 4242)
	for _, args := range [][]string{{"-m", "u:65534:---", denied}, {"-m", "m::---", masked}} {
		if out, err := exec.Command("setfacl", args...).CombinedOutput(); err != nil {
			t.Fatalf("setfacl %v: %v\n%s", args, err, out)
		}
	}
	member := Cred{UID: 65534, GID: 65534, Groups: []uint32{4242}}
	for _, tc := range []struct {
		rel  string
		cred Cred
	}{{"denied", nobody}, {"masked", member}} {
		f, err := r.OpenAs(tc.cred, tc.rel, os.O_RDONLY, 0, Beneath)
		if !errors.Is(err, syscall.EACCES) {
			t.Errorf("%s as %v: %v, want EACCES from the ACL", tc.rel, tc.cred, err)
		}
		if f != nil {
			f.Close()
		}
	}
}

// TestDoLeavesOtherThreadsAlone: while many goroutines act as nobody, the
// daemon's own opens (on any thread) keep root's rights, and the acting
// goroutine has them back after Do.
func TestDoLeavesOtherThreadsAlone(t *testing.T) {
	needRoot(t)
	_, dir := tree(t)
	secret := filepath.Join(dir, "secret")
	write(t, secret, 0o600)
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := 0; i < 200; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			err := nobody.Do(func() error {
				_, err := os.ReadFile(secret)
				return err
			})
			if !errors.Is(err, syscall.EACCES) {
				errs <- errors.New("nobody read the secret: " + errString(err))
			}
			if _, err := os.ReadFile(secret); err != nil {
				errs <- errors.New("root after Do: " + err.Error())
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := os.ReadFile(secret); err != nil {
				errs <- errors.New("root beside Do: " + err.Error())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestResolutionStaysBeneath(t *testing.T) {
	r, dir := tree(t)
	write(t, filepath.Join(dir, "d/file"), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(dir, "abs"))
	os.Symlink("../../../../../../etc/passwd", filepath.Join(dir, "d/up"))
	os.Symlink("file", filepath.Join(dir, "d/rel"))
	os.Symlink("d", filepath.Join(dir, "dirlink"))
	for _, tc := range []struct {
		rel     string
		resolve uint64
		want    error
	}{
		{"abs", Beneath, syscall.EXDEV},
		{"d/up", Beneath, syscall.EXDEV},
		{"d/rel", Beneath, nil},
		{"d/rel", NoSymlinks, syscall.ELOOP},
		{"dirlink/file", NoSymlinks, syscall.ELOOP},
		{"dirlink/file", Beneath, nil},
		{"../d/./file", Beneath, nil}, // cleaned lexically: ".." stops at SOURCE
	} {
		f, err := r.Open(tc.rel, os.O_RDONLY, 0, tc.resolve)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("open %s: %v, want %v", tc.rel, err, tc.want)
		}
		if f != nil {
			f.Close()
		}
	}
	if _, err := Clean("a\x00b"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a NUL byte: %v", err)
	}
}

func TestOpenRegularNeverBlocks(t *testing.T) {
	r, dir := tree(t)
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "dir"), 0o755)
	write(t, filepath.Join(dir, "file"), 0o644)
	for _, rel := range []string{"fifo", "dir"} {
		// A blocking open of the FIFO would hang here forever.
		_, _, err := r.OpenRegular(Daemon(), rel, 0, Beneath)
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("%s: %v, want ErrNotRegular", rel, err)
		}
	}
	f, st, err := r.OpenRegular(Daemon(), "file", unix.O_NOATIME, Beneath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if fl&unix.O_NONBLOCK != 0 || st.Size != 4 {
		t.Errorf("flags %#x (O_NONBLOCK left set?), size %d", fl, st.Size)
	}
}

// TestDoClearsCapabilities: acting for another user, the thread keeps no
// capability (CAP_SYS_ADMIN and CAP_SETFCAP included), and has them all
// back afterwards.
func TestDoClearsCapabilities(t *testing.T) {
	needRoot(t)
	capEff := func() string {
		b, err := os.ReadFile("/proc/thread-self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatal("no CapEff line")
		return ""
	}
	var inside string
	nobody.Do(func() error { inside = capEff(); return nil })
	if inside != "0000000000000000" {
		t.Errorf("CapEff while acting as nobody: %s, want none", inside)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := capEff()
	nobody.Do(func() error { return nil })
	if after := capEff(); after != before {
		t.Errorf("CapEff after Do: %s, before %s", after, before)
	}
}

// TestCapabilitiesDecideNotUID: what passes another owner's modes is a
// capability the caller holds, whatever its uid.
func TestCapabilitiesDecideNotUID(t *testing.T) {
	needRoot(t)
	r, dir := tree(t)
	other := filepath.Join(dir, "other")
	write(t, other, 0o600)
	os.Chown(other, 65534, 65534)
	const readSearch, override = 1 << unix.CAP_DAC_READ_SEARCH, 1 << unix.CAP_DAC_OVERRIDE
	for _, tc := range []struct {
		cred Cred
		want error
	}{
		{Daemon(), nil},
		{Cred{}, syscall.EACCES}, // uid 0, no capability
		{Cred{Caps: Daemon().Caps &^ (readSearch | override)}, syscall.EACCES},
		{Cred{Caps: readSearch}, nil},
		{Cred{UID: 1000, GID: 1000, Caps: override}, nil},
	} {
		f, _, err := r.OpenRegular(tc.cred, "other", 0, Beneath)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("as %v: %v, want %v", tc.cred, err, tc.want)
		}
		if f != nil {
			f.Close()
		}
	}
}
