package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gdsfs/gdsfs/daemon/config"
)

// Status words of a Check. PASS and "not measured here: WHY" leave the
// run's exit status 0; MISS, FAIL and "not checked: WHY" make it 1 (verdict).
const (
	statusPass    = "PASS"
	statusMiss    = "MISS" // a figure measured, short of its goal
	statusFail    = "FAIL" // a correctness check (bytes, leases, resources) failed
	statusNotHere = "not measured here: "
	statusNoCheck = "not checked: "
)

// VerdictRule is the exit-status rule every `gdsfs bench` command states
// in its help.
const VerdictRule = `Exit status: 0 only when every target that applies here passed. A target
is PASS; MISS (measured, short of its goal); FAIL (a correctness check:
bytes, leases, daemon resources); "not checked: WHY" (it applies here but a
figure it needs could not be measured: a case that failed, a baseline asked
for that did not run, a GPU target where staging.device is not host and no
GPU was found); or "not measured here: WHY" (it does not apply to what was
asked: a GPU target with staging.device=host, a baseline whose flag was not
given). MISS, FAIL and "not checked" exit 1; so does any case the command
measures by default or by flag that could not run.`

// Check is one target checked against figures measured in the same run.
type Check struct {
	Goal   string  `json:"goal"`
	Got    float64 `json:"got,omitempty"`
	Want   float64 `json:"want,omitempty"`
	Unit   string  `json:"unit,omitempty"`    // GB/s, ms, x
	AtMost bool    `json:"at_most,omitempty"` // passes when Got <= Want (else Got >= Want)
	Status string  `json:"status"`            // PASS, MISS, FAIL, "not checked: WHY" or "not measured here: WHY"
}

// newCheck compares got with want; a zero got or want means one side was
// not measured, and why says which: the target is not checked.
func newCheck(goal string, got, want float64, unit string, atMost bool, why string) Check {
	c := Check{Goal: goal, Got: got, Want: want, Unit: unit, AtMost: atMost}
	switch {
	case got == 0 || want == 0:
		c.Status = statusNoCheck + why
	case atMost && got <= want, !atMost && got >= want:
		c.Status = statusPass
	default:
		c.Status = statusMiss
	}
	return c
}

// notHere is a target that does not apply to what was asked (why says
// which choice of the user's left it out).
func notHere(goal, why string) Check { return Check{Goal: goal, Status: statusNotHere + why} }

// notChecked is a target that applies but could not be checked.
func notChecked(goal, why string) Check { return Check{Goal: goal, Status: statusNoCheck + why} }

// gpuOnly is a target that has a meaning only on a GPU, in a run that
// stages on the host backend: not measured here where the user chose
// that backend (staging.device=host), not checked where no GPU was found.
func gpuOnly(goal string, hostChosen bool) Check {
	if hostChosen {
		return notHere(goal, whyHost)
	}
	return notChecked(goal, whyNoGPU)
}

const (
	whyHost  = "host backend (staging.device=host)"
	whyNoGPU = "no GPU: the mount stages on the host backend though staging.device is not host"
)

// boolCheck is a yes/no correctness check; why says why it could not be
// made (a failure too).
func boolCheck(goal string, ok bool, why string) Check {
	switch {
	case ok:
		return Check{Goal: goal, Status: statusPass}
	case why != "":
		return Check{Goal: goal, Status: statusFail + ": " + why}
	}
	return Check{Goal: goal, Status: statusFail}
}

// passes says whether a check leaves the exit status 0.
func (c Check) passes() bool {
	return c.Status == statusPass || strings.HasPrefix(c.Status, statusNotHere)
}

// verdict is the run's outcome: nil when every check passes (see
// VerdictRule), else an error naming each one that does not.
func verdict(checks []Check) error {
	var bad []string
	for _, c := range checks {
		if !c.passes() {
			bad = append(bad, c.Goal+": "+c.Status)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d targets failed: %s", len(bad), len(checks), strings.Join(bad, "; "))
}

// hostChosen says whether sets (config.yaml keys) choose the host backend.
func hostChosen(sets []string) bool {
	cfg, err := config.Load("", sets)
	return err == nil && cfg.Staging.Device == "host"
}

// String is the check as one line of the text report.
func (c Check) String() string {
	if (c.Status != statusPass && c.Status != statusMiss) || (c.Got == 0 && c.Want == 0) {
		return fmt.Sprintf("target  %-62s %s", c.Goal, c.Status)
	}
	op := ">="
	if c.AtMost {
		op = "<="
	}
	if c.Status == statusMiss {
		op = map[string]string{">=": "< ", "<=": "> "}[op]
	}
	return fmt.Sprintf("target  %-62s %s  %s %s %s %s", c.Goal, c.Status, num(c.Got), op, num(c.Want), c.Unit)
}

// num formats a figure with three significant decimals for small values.
func num(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.3f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func writeChecks(w io.Writer, checks []Check) {
	for _, c := range checks {
		fmt.Fprintln(w, c.String())
	}
}

// appendReport appends v as one JSON line {"bench": name, ...v} to path
// ("" does nothing): the machine-readable record of a run, beside the text.
func appendReport(path, name string, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(map[string]any{"bench": name, "result": v})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	return joinClose(err, f)
}

// printResult records res in the report file (appendReport, as bench name)
// and writes it to w: as JSON with asJSON, else through text.
func printResult(w io.Writer, report, name string, res any, asJSON bool, text func(io.Writer)) error {
	if err := appendReport(report, name, res); err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(w).Encode(res)
	}
	text(w)
	return nil
}

func joinClose(err error, c io.Closer) error {
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	return err
}

// lastJSONLine decodes the last line of out that starts with '{' into v:
// the helpers print their result last, after any library's chatter.
func lastJSONLine(out []byte, v any) error {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "{") {
			return json.Unmarshal([]byte(l), v)
		}
	}
	return fmt.Errorf("no JSON result in the output: %q", tail(string(out), 400))
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// phases says on stderr when each phase of a bench starts and how long
// the one before took, so that a slow phase shows while it runs.
type phases struct {
	bench string
	name  string
	t0    time.Time
}

func newPhases(bench string) *phases { return &phases{bench: bench} }

// start ends the current phase (printing its time) and starts the next.
func (p *phases) start(format string, a ...any) {
	p.done()
	p.name, p.t0 = fmt.Sprintf(format, a...), time.Now()
	fmt.Fprintf(os.Stderr, "%s: %s ...\n", p.bench, p.name)
}

// done ends the current phase.
func (p *phases) done() {
	if p.name != "" {
		fmt.Fprintf(os.Stderr, "%s: %s: %.1f s\n", p.bench, p.name, time.Since(p.t0).Seconds())
	}
	p.name = ""
}
