package bench

import (
	"fmt"
	"io"
	"strings"
)

// Lease targets, milliseconds, and the samples they need.
const (
	repeatTargetMS = 0.3
	firstTargetMS  = 1.0
	minSamples     = 30
)

func (r leaseResult) row(name string) (leaseRow, bool) {
	for _, row := range r.Rows {
		if row.Name == name {
			return row, true
		}
	}
	return leaseRow{}, false
}

// leaseChecks are the targets: each repeat and first row, every size.
// They are GPU figures: on the host backend they are gpuOnly. Any other
// row that could not be measured is a case that failed.
func leaseChecks(r leaseResult) []Check {
	var out []Check
	for _, t := range []struct {
		row  string
		want float64
	}{{rowGoRepeat, repeatTargetMS}, {rowPyRepeat, repeatTargetMS}, {rowGoFirst, firstTargetMS}, {rowPyFirst, firstTargetMS}} {
		row, ok := r.row(t.row)
		for _, size := range r.Sizes {
			goal := fmt.Sprintf("%s, %s, median <= %g ms", t.row, size, t.want)
			got := row.Median[size]
			switch {
			case r.Device == "host":
				out = append(out, gpuOnly(goal, r.HostChosen))
			case !ok:
				out = append(out, notChecked(goal, "no such row measured"))
			case row.Why != "":
				out = append(out, notChecked(goal, row.Why))
			case row.Samples < minSamples:
				out = append(out, Check{Goal: goal, Got: got, Want: t.want, Unit: "ms", AtMost: true,
					Status: fmt.Sprintf("%s%d samples, want at least %d", statusNoCheck, row.Samples, minSamples)})
			default:
				out = append(out, newCheck(goal, got, t.want, "ms", true, "not measured"))
			}
		}
	}
	for _, row := range r.Rows {
		if row.Why != "" && !strings.HasPrefix(row.Why, statusNotHere) {
			out = append(out, notChecked("case ran: "+row.Name, row.Why))
		}
	}
	return out
}

func writeLeaseText(w io.Writer, r *leaseResult) {
	fmt.Fprintf(w, "resident files on %s; medians in ms", r.Device)
	if r.FastPath != "" {
		fmt.Fprintf(w, "; Python client fast path: %s", r.FastPath)
	}
	fmt.Fprint(w, "\n\n")
	fmt.Fprintf(w, "%-40s %8s", "what", "samples")
	for _, s := range r.Sizes {
		fmt.Fprintf(w, " %9s", s)
	}
	fmt.Fprintln(w)
	var why []string
	for _, row := range r.Rows {
		fmt.Fprintf(w, "%-40s %8d", row.Name, row.Samples)
		for _, s := range r.Sizes {
			fmt.Fprintf(w, " %9s", num(row.Median[s]))
		}
		fmt.Fprintln(w)
		if row.Why != "" {
			why = append(why, fmt.Sprintf("%s: unavailable: %s", row.Name, row.Why))
		}
	}
	for _, s := range why {
		fmt.Fprintln(w, s)
	}
	if floor, ok := r.row(rowFloor); ok && floor.Why == "" {
		if rep, ok := r.row(rowGoRepeat); ok {
			fmt.Fprint(w, "\nGo repeat / floor:")
			for _, s := range r.Sizes {
				if f := floor.Median[s]; f > 0 {
					fmt.Fprintf(w, "  %s %.1fx", s, rep.Median[s]/f)
				}
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w)
	writeChecks(w, r.Checks)
}
