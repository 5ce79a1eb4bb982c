package bench

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"go.yaml.in/yaml/v3"

	"github.com/gdsfs/gdsfs/daemon/config"
	"github.com/gdsfs/gdsfs/gpu"
)

// ioSettings is the io section as "key=value ..." (whatever its types are).
func ioSettings(cfg *config.Config) string {
	b, err := yaml.Marshal(cfg.IO)
	if err != nil {
		return ""
	}
	var m map[string]any
	if yaml.Unmarshal(b, &m) != nil {
		return ""
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, m[k]))
	}
	return "io: " + strings.Join(parts, " ")
}

// stageFigures are the figures the stage targets compare.
type stageFigures struct {
	defaults, defaultsCold, h2d, diskDirect, diskBuffered, peer float64
	peerName                                                    string
	kvik                                                        kvikResult
	kvikWhy                                                     string      // why KvikIO has no figure
	rounds                                                      []roundStat // gdsfs's defaults against KvikIO's best, per round
	kvikAsked, peersAsked, coldAsked                            bool        // the flags that ask for those baselines
	gpu, hostChosen                                             bool
}

func (b *stageBench) figures() stageFigures {
	f := stageFigures{gpu: b.dev.Kind() == gpu.KindCUDA, hostChosen: b.hostChosen,
		kvikAsked: b.o.Kvik.Bin != "", peersAsked: b.o.Peers && !b.o.Quick, coldAsked: b.o.Cold}
	for _, r := range b.rows {
		switch {
		case r.Kind == "defaults":
			f.defaults, f.defaultsCold = r.Warm, r.Cold
		case r.Kind == "peer" && r.Warm > f.peer:
			f.peer, f.peerName = r.Warm, r.Name
		case r.Name == rowH2D:
			f.h2d = r.Warm
		case r.Name == rowDisk:
			f.diskDirect = r.Cold
		case r.Name == rowDiskBuffered:
			f.diskBuffered = r.Cold
		}
	}
	if b.kvik != nil {
		f.kvik = b.kvik.best()
		f.kvikWhy = "no KvikIO run succeeded: " + b.kvik.firstError()
		f.rounds = b.roundStats()
	}
	return f
}

// roundStats are gdsfs's defaults against KvikIO's best of the same
// round, for each round KvikIO ran.
func (b *stageBench) roundStats() []roundStat {
	var def []float64
	for _, r := range b.rows {
		if r.Kind == "defaults" {
			def = r.Rounds
		}
	}
	n := max(b.o.Rounds, len(def))
	for _, r := range b.kvik.Results {
		n = max(n, r.Round+1)
	}
	var out []roundStat
	for i := range n {
		best, ran := b.kvik.roundBest(i)
		if !ran {
			continue
		}
		st := roundStat{Round: i + 1, Kvik: best.GBps, KvikSetting: best.Setting}
		if i < len(def) {
			st.Defaults = def[i]
		}
		st.Ratio = ratio(st.Defaults, st.Kvik)
		out = append(out, st)
	}
	return out
}

const (
	h2dGoal  = "gdsfs defaults >= 0.92 x pinned host-to-device copy"
	coldGoal = "cold gdsfs defaults >= 0.95 x best of disk buffered, O_DIRECT"
)

// stageChecks are the targets of `gdsfs bench stage`: a baseline not
// asked for leaves its target not measured here; one asked for that has
// no figure leaves it not checked.
func stageChecks(f stageFigures) []Check {
	peerGoal := "gdsfs defaults >= 1.3 x best Python peer"
	if f.peerName != "" {
		peerGoal += " (" + strings.TrimPrefix(f.peerName, "peer: ") + ")"
	}
	cold := notHere(coldGoal, "no --cold")
	if f.coldAsked {
		cold = newCheck(coldGoal, f.defaultsCold, 0.95*max(f.diskDirect, f.diskBuffered), "GB/s", false,
			"gdsfs's cold staging or both disk reads failed")
	}
	if !f.gpu {
		return []Check{gpuOnly(kvikGoal(0, kvikSetting{}), f.hostChosen), gpuOnly(h2dGoal, f.hostChosen), gpuOnly(peerGoal, f.hostChosen), cold}
	}
	var out []Check
	switch {
	case !f.kvikAsked:
		out = append(out, notHere(kvikGoal(0, kvikSetting{}), "no --kvikio reader given"))
	case len(f.rounds) == 0:
		out = append(out, notChecked(kvikGoal(0, kvikSetting{}), f.kvikWhy))
	}
	if f.kvikAsked {
		for _, st := range f.rounds {
			why := "gdsfs's staging failed in this round"
			if st.Kvik == 0 {
				why = "no KvikIO run of this round succeeded: " + f.kvikWhy
			}
			out = append(out, newCheck(kvikGoal(st.Round, st.KvikSetting), st.Ratio, 1.0, "x", false, why))
		}
	}
	peer := notHere(peerGoal, "no Python peer asked for (--peers, no --quick)")
	if f.peersAsked {
		peer = newCheck(peerGoal, f.defaults, 1.3*f.peer, "GB/s", false, "no Python peer measured")
	}
	return append(out, newCheck(h2dGoal, f.defaults, 0.92*f.h2d, "GB/s", false, "gdsfs's staging or the copy failed"), peer, cold)
}

// kvikGoal is the KvikIO target of round r (0: every round), naming the
// setting that was KvikIO's best in it.
func kvikGoal(r int, s kvikSetting) string {
	if r == 0 {
		return "gdsfs defaults >= 1.0 x KvikIO best, in every round"
	}
	g := fmt.Sprintf("round %d: gdsfs defaults >= 1.0 x KvikIO best of the round", r)
	if s.Threads > 0 {
		g += " (" + s.String() + ")"
	}
	return g
}

// rowChecks fail the run for each case that could not run, other than
// those not measured here.
func rowChecks(rows []benchRow) []Check {
	var out []Check
	for _, r := range rows {
		if r.Why != "" && !strings.HasPrefix(r.Why, statusNotHere) {
			out = append(out, notChecked("case ran: "+r.Name, r.Why))
		}
	}
	return out
}

// stageResult is the JSON of `gdsfs bench stage`.
type stageResult struct {
	File   string      `json:"file"`
	Size   int64       `json:"size"`
	Device string      `json:"device"`
	Rows   []benchRow  `json:"rows"`
	Kvik   *kvikSweep  `json:"kvikio,omitempty"`
	Ratios []roundStat `json:"rounds,omitempty"`
	Ratio  stageRatios `json:"ratios"`
	Checks []Check     `json:"targets"`
}

// stageRatios are gdsfs's defaults over the baselines (0: not measured).
type stageRatios struct {
	KvikBest    float64     `json:"kvikio_best_gbps,omitempty"`
	KvikSetting kvikSetting `json:"kvikio_best_setting"`
	OverKvik    float64     `json:"defaults_over_kvikio_best,omitempty"`
	OverH2D     float64     `json:"defaults_over_h2d,omitempty"`
}

// roundStat is one round: gdsfs's defaults against KvikIO's best of that round.
type roundStat struct {
	Round    int     `json:"round"`
	Defaults float64 `json:"gdsfs_gbps"`
	Kvik     float64 `json:"kvikio_best_gbps"`
	// KvikSetting is KvikIO's best setting of the round.
	KvikSetting kvikSetting `json:"kvikio_best_setting"`
	Ratio       float64     `json:"ratio"`
}

func (b *stageBench) result() stageResult {
	f := b.figures()
	res := stageResult{File: b.path, Size: b.size, Device: b.dev.Name(), Rows: b.rows, Kvik: b.kvik,
		Ratio:  stageRatios{KvikBest: f.kvik.GBps, KvikSetting: f.kvik.Setting, OverKvik: ratio(f.defaults, f.kvik.GBps)},
		Checks: append(stageChecks(f), rowChecks(b.rows)...)}
	if f.gpu {
		res.Ratio.OverH2D = ratio(f.defaults, f.h2d)
	}
	res.Ratios = f.rounds
	return res
}

func (b *stageBench) print() error {
	res := b.result()
	if err := printResult(os.Stdout, b.o.Report, "stage", res, b.o.JSON, func(w io.Writer) { writeStageText(w, res) }); err != nil {
		return err
	}
	return verdict(res.Checks)
}

func writeStageText(w io.Writer, res stageResult) {
	fmt.Fprintf(w, "file %s (%d bytes) on %s\n\n", res.File, res.Size, res.Device)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "what\twarm GB/s\tcold GB/s\trounds\tnote\n")
	for _, r := range res.Rows {
		note := r.Detail
		switch {
		case strings.HasPrefix(r.Why, statusNotHere):
			note = r.Why
		case r.Why != "":
			note = "unavailable: " + r.Why
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, num(r.Warm), num(r.Cold), joinNums(r.Rounds), note)
	}
	if res.Kvik != nil {
		for i, r := range res.Kvik.bySetting() {
			name := "KvikIO compat " + r.Setting.String()
			if i == 0 && r.GBps > 0 {
				name += " (best)"
			}
			note := ""
			if e := res.Kvik.errorOf(r.Setting); e != "" {
				note = "failed: " + e
			}
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\t%s\n", name, num(r.GBps), joinNums(res.Kvik.rounds(r.Setting)), note)
		}
	}
	tw.Flush()
	if len(res.Ratios) > 0 {
		fmt.Fprintln(w)
		for _, st := range res.Ratios {
			fmt.Fprintf(w, "round %d: gdsfs defaults %s GB/s, KvikIO best of the round %s GB/s (%s), ratio %s\n",
				st.Round, num(st.Defaults), num(st.Kvik), st.KvikSetting, num(st.Ratio))
		}
	}
	fmt.Fprintln(w)
	if r := res.Ratio; r.OverKvik > 0 {
		fmt.Fprintf(w, "gdsfs defaults / KvikIO best (%s, %s GB/s): %s (target >= 1.0 in every round)\n", r.KvikSetting, num(r.KvikBest), num(r.OverKvik))
	}
	if r := res.Ratio; r.OverH2D > 0 {
		fmt.Fprintf(w, "gdsfs defaults / pinned host-to-device copy: %s (target >= 0.92)\n", num(r.OverH2D))
	}
	writeChecks(w, res.Checks)
}

// rounds is the figure of setting s in each round it ran.
func (k *kvikSweep) rounds(s kvikSetting) []float64 {
	var out []float64
	for _, r := range k.Results {
		if r.Setting == s {
			out = append(out, r.GBps)
		}
	}
	return out
}

// errorOf is the first error of setting s in any round, "" if none.
func (k *kvikSweep) errorOf(s kvikSetting) string {
	for _, r := range k.Results {
		if r.Setting == s && r.Err != "" {
			return r.Err
		}
	}
	return ""
}

func joinNums(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	var parts []string
	for _, x := range xs {
		parts = append(parts, num(x))
	}
	return strings.Join(parts, " ")
}
