package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
	"github.com/gdsfs/gdsfs/gpu/host"
)

// cudaStandIn is a host device that says it is CUDA, so that runPeers
// gets as far as running its script.
type cudaStandIn struct{ gpu.Device }

func (cudaStandIn) Kind() string { return gpu.KindCUDA }

// TestPeersImportNothingFromTheTempDir: the peers' script, run as root by
// bench stage --peers, imports no module another user put in the
// temporary directory (a shared /tmp).
func TestPeersImportNothingFromTheTempDir(t *testing.T) {
	tmp := t.TempDir()
	if err := os.Chmod(tmp, 0o1777); err != nil { // a /tmp: anyone may add files
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tmp)
	marker := filepath.Join(t.TempDir(), "imported")
	for _, name := range []string{"json.py", "time.py", "warnings.py", "torch.py"} {
		body := "open(" + pyQuote(marker) + ", 'w').write(__name__)\nraise SystemExit(3)\n"
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "f.bin")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	dev := cudaStandIn{host.Open(gpu.Options{ChunkSize: 1 << 20})}
	rows := runPeers(file, dev, StageOptions{Runs: 1}, false)
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("the peers' script imported %s from %s (any user may put files there); rows %+v", b, tmp, rows)
	}
}

func pyQuote(s string) string { return "'" + s + "'" }
