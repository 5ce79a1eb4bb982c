package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/gdsfs/gdsfs/internal/access"
	"github.com/gdsfs/gdsfs/staging"
)

// cacheListing is .gdsfs/cache.json: the entries of .gdsfs/cache as
// objects (staging.Info's fields), one per replica.
type cacheListing struct {
	Entries []staging.Info `json:"entries"`
}

// readableEntries are the cache's entries the reader c may open for
// reading (canRead decides, as c).
func (d *daemon) readableEntries(c access.Cred, canRead func(access.Cred, string) bool) []staging.Info {
	out := []staging.Info{}
	for _, e := range d.cache.Entries() {
		if canRead(c, e.Path) {
			out = append(out, e)
		}
	}
	return out
}

// cacheText is one line per entry the reader c may open for reading:
// path, size, state, load path, GB/s, leases, tab-separated under a
// header.
func (d *daemon) cacheText(c access.Cred, canRead func(access.Cred, string) bool) []byte {
	var b bytes.Buffer
	b.WriteString("# path\tsize\tstate\tload_path\tload_gbps\tleases\tdevice\tnote\n")
	for _, e := range d.readableEntries(c, canRead) {
		fmt.Fprintf(&b, "%s\t%d\t%s\t%s\t%.2f\t%d\t%s\t%s\n", e.Path, e.Size, e.State, orDash(e.LoadPath), e.GBps, e.Leases, e.Device, orDash(e.Note))
	}
	return b.Bytes()
}

// cacheJSON is cacheText's entries as one JSON object (cacheListing).
func (d *daemon) cacheJSON(c access.Cred, canRead func(access.Cred, string) bool) []byte {
	b, _ := json.MarshalIndent(cacheListing{Entries: d.readableEntries(c, canRead)}, "", "  ")
	return append(b, '\n')
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
