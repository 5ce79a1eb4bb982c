package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestLeaseNameNotUTF8: a file whose name is not UTF-8 is leased as
// itself or not at all, never as the file whose name replaces its bad
// bytes with U+FFFD (which another user may make beside it).
func TestLeaseNameNotUTF8(t *testing.T) {
	needMount(t)
	src := t.TempDir()
	own := filepath.Join(src, "data", "model-\xff.bin")
	randomFile(t, own, 70000, 1)
	randomFile(t, filepath.Join(src, "data", "model-\uFFFD.bin"), 70000, 2)
	b, err := os.ReadFile(own)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	m := startMount(t, src)
	out, err := exec.Command(bins.leasecheck, m.path("data/model-\xff.bin")).CombinedOutput()
	if err != nil {
		t.Logf("leasecheck refused the name (allowed): %v %s", err, out)
		return
	}
	var r struct {
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("leasecheck: %v\n%s", err, out)
	}
	if r.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("leasing %q gave other bytes than its own (those of %q?)", "data/model-\xff.bin", "data/model-\uFFFD.bin")
	}
}
