package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
)

// target is one goal checked against numbers measured in the same run.
type target struct {
	Goal   string  `json:"goal"`
	Got    float64 `json:"got_gbps"`
	Want   float64 `json:"want_gbps"`
	Met    bool    `json:"met"`
	Reason string  `json:"reason,omitempty"` // why it could not be checked
}

func stageTargets(rows []benchRow) []target {
	var best, bestCold, peer, peerName, h2d, disk = 0.0, 0.0, 0.0, "", 0.0, 0.0
	for _, r := range rows {
		switch {
		case r.Kind == "gdsfs":
			best, bestCold = max(best, r.Warm), max(bestCold, r.Cold)
		case r.Kind == "peer" && r.Warm > peer:
			peer, peerName = r.Warm, r.Name
		case r.Name == "pinned host-to-device copy":
			h2d = r.Warm
		case r.Name == "disk O_DIRECT read, 16 MiB":
			disk = r.Cold
		}
	}
	check := func(goal string, got, base, ratio float64, missing string) target {
		if got == 0 || base == 0 {
			return target{Goal: goal, Reason: missing}
		}
		return target{Goal: goal, Got: got, Want: base * ratio, Met: got >= base*ratio}
	}
	return []target{
		check("warm gdsfs >= 1.3 x best peer ("+peerName+")", best, peer, 1.3, "no peer measured (--peers, on a GPU)"),
		check("warm gdsfs >= 0.7 x pinned host-to-device copy", best, h2d, 0.7, "not measured"),
		check("cold gdsfs >= 0.9 x disk O_DIRECT", bestCold, disk, 0.9, "cold not measured (--cold)"),
	}
}

func printStageBench(b *stageBench, asJSON bool) error {
	targets := stageTargets(b.rows)
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(map[string]any{
			"file": b.path, "size": b.size, "device": b.dev.Name(), "rows": b.rows, "targets": targets,
		})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "what\twarm GB/s\tcold GB/s\tnote\n")
	num := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	for _, r := range b.rows {
		note := r.Detail
		if r.Why != "" {
			note = "unavailable: " + r.Why
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, num(r.Warm), num(r.Cold), note)
	}
	tw.Flush()
	fmt.Println()
	for _, t := range targets {
		switch {
		case t.Reason != "":
			fmt.Printf("target  %-55s not checked: %s\n", t.Goal, t.Reason)
		case t.Met:
			fmt.Printf("target  %-55s PASS  %.2f >= %.2f GB/s\n", t.Goal, t.Got, t.Want)
		default:
			fmt.Printf("target  %-55s MISS  %.2f <  %.2f GB/s\n", t.Goal, t.Got, t.Want)
		}
	}
	return nil
}
