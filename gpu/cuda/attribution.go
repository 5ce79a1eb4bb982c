package cuda

import (
	"fmt"
	"strings"
)

// StagedBytes is what gdsfs counted as read by cuFile onto one device.
type StagedBytes struct {
	Name        string // "GPU-<uuid>"
	Ordinal     int
	BytesCuFile uint64
	Loading     int // loads in progress on it
}

// Attribute checks gdsfs's attribution against cuFile's own counters.
// mode is the cuFile mode gdsfs runs it in ("gds" or "compat"). Each
// device's cuFile bytes must equal the bytes cuFile counted for that GPU,
// and cuFile's reads there must have taken the path mode says: no POSIX
// reads in gds mode, no nvidia-fs or P2PDMA reads in compat mode. It
// returns "ok", "pending: ..." while loads are in progress and cuFile is
// ahead only by them, or "mismatch ..." naming every disagreement. Below
// level 3 cuFile has no per-GPU counters: the totals are compared.
func Attribute(mode string, staged []StagedBytes, st CuFileStats) string {
	var bad []string
	pending, loading := true, 0
	cmp := func(where string, g, c uint64) {
		if g != c {
			bad = append(bad, fmt.Sprintf("gdsfs=%d cufile=%d%s", g, c, where))
			pending = pending && c > g
		}
	}
	if st.Level < 3 {
		var g uint64
		for _, d := range staged {
			g += d.BytesCuFile
			loading += d.Loading
		}
		cmp(" (all GPUs)", g, st.ReadBytes)
		return verdict(bad, pending, loading,
			fmt.Sprintf(" (totals only: level %d has no per-GPU counters)", st.Level))
	}
	seen := map[string]bool{}
	for _, d := range staged {
		loading += d.Loading
		c, _ := st.GPU(d.Name, d.Ordinal)
		seen[c.Name] = true
		cmp(" on "+d.Name, d.BytesCuFile, c.ReadBytes)
		switch {
		case mode == "gds" && c.PosixReads > 0:
			bad = append(bad, fmt.Sprintf("%s: cuFile read %d times through POSIX in gds mode", d.Name, c.PosixReads))
			pending = false
		case mode != "gds" && c.NvfsReads+c.P2PReads > 0:
			bad = append(bad, fmt.Sprintf("%s: cuFile read %d times by nvidia-fs or P2PDMA in compat mode",
				d.Name, c.NvfsReads+c.P2PReads))
			pending = false
		}
	}
	for _, c := range st.GPUs {
		if !seen[c.Name] && c.ReadBytes > 0 {
			cmp(" on "+c.Name+" (not a staging device)", 0, c.ReadBytes)
			pending = false
		}
	}
	return verdict(bad, pending, loading, "")
}

func verdict(bad []string, pending bool, loading int, note string) string {
	switch {
	case len(bad) == 0:
		return "ok" + note
	case pending && loading > 0:
		return fmt.Sprintf("pending: %d loads in progress (%s)%s", loading, strings.Join(bad, "; "), note)
	}
	return "mismatch " + strings.Join(bad, "; ") + note
}
