package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildsWithoutCgo: the Go client (and the lease checker built on it)
// builds with CGO_ENABLED=0 and links neither the daemon's packages nor
// zap nor the cgo CUDA backend.
func TestBuildsWithoutCgo(t *testing.T) {
	env := append(os.Environ(), "CGO_ENABLED=0")
	list := exec.Command("go", "list", "-deps", ".", "../integration/leasecheck")
	list.Env = env
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, bad := range []string{"go.uber.org/zap", "github.com/gdsfs/gdsfs/gpu", "github.com/gdsfs/gdsfs/staging",
			"github.com/gdsfs/gdsfs/ipc", "github.com/gdsfs/gdsfs/internal/", "runtime/cgo"} {
			if d == bad || strings.HasPrefix(d, bad+"/") || strings.HasPrefix(d, bad) && strings.HasSuffix(bad, "/") {
				t.Errorf("the client depends on %s", d)
			}
		}
	}
	if len(deps) > 150 {
		t.Errorf("the client links %d packages; it should stay small", len(deps))
	}
	build := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "leasecheck"), "../integration/leasecheck")
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build of the lease checker: %v\n%s", err, out)
	}
	t.Logf("%d packages", len(deps))
}
