package staging

import (
	"testing"

	"github.com/gdsfs/gdsfs/internal/units"
	"github.com/gdsfs/gdsfs/staging/loader"
)

// TestAutoIOResolved: auto io values take the loader's rule; set values
// are kept.
func TestAutoIOResolved(t *testing.T) {
	_, io := testOptions()
	io.NumThreads, io.BounceSize = 0, 0
	r := io.resolved()
	if r.NumThreads < 4 || r.NumThreads > 16 || r.BounceSize != units.AutoSize(loader.AutoBounce(int(r.NumThreads))) {
		t.Fatalf("resolved %+v", r)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	io.NumThreads, io.BounceSize = 3, 8192
	if r := io.resolved(); r.NumThreads != 3 || r.BounceSize != 8192 {
		t.Fatalf("set values changed: %+v", r)
	}
}
