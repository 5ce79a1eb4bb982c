package bench

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/gdsfs/gdsfs/proto"
)

//go:embed multigpu.py
var multiGPUScript []byte

// mgLease is one lease a multigpu.py consumer made.
type mgLease struct {
	Asked  string `json:"asked"`
	Device string `json:"device"`
	Local  bool   `json:"local"`
	Sha256 string `json:"sha256"`
}

// mgDevice is a device of the mount, as its stats.json lists it.
type mgDevice struct {
	Name    string `json:"name"`
	Ordinal int    `json:"ordinal"`
	Pinned  int    `json:"leases_pinned"`
}

// mgRun is the consumers' part of `bench multigpu`: a mount of the files'
// directory, the helper, and the verdicts so far.
type mgRun struct {
	ctx      context.Context
	m        *benchMount
	py       *pyEnv
	script   string
	rel      string
	want     string // the file's SHA-256
	devs     []mgDevice
	cuda     bool
	verdicts []mgVerdict
}

func (r *mgRun) check(name string, ok bool, format string, args ...any) bool {
	r.verdicts = append(r.verdicts, mgVerdict{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	return ok
}

// consumers mounts o.Dir and runs the consumer checks on rel.
func consumers(ctx context.Context, o MultiGPUOptions, rel, want string) []mgVerdict {
	r := &mgRun{ctx: ctx, rel: rel, want: want}
	var err error
	if r.py, err = newPyEnv(o.Py, o.Work, true); err == nil {
		r.script, err = r.py.write("multigpu.py", multiGPUScript)
	}
	if err == nil {
		r.m, err = startMount(ctx, o.Work, "multigpu", o.Dir, multiGPUSets(o.Sets))
	}
	if err != nil {
		r.check("mount and helpers", false, "%v", err)
		return r.verdicts
	}
	defer r.m.stop()
	if err := r.run(); err != nil {
		r.check("consumers ran", false, "%v (daemon log %s)", err, r.m.d.logPath)
	}
	return r.verdicts
}

// run is the checks in order; an error is something that stopped them.
func (r *mgRun) run() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	out, err := exec.CommandContext(r.ctx, exe, "warmup", "--wait", "--gpus", "all", "--timeout", "5m", r.m.path(r.rel)).CombinedOutput()
	if !r.check("warmup --gpus all", err == nil, "%.2f s: %s%v", time.Since(start).Seconds(), strings.Join(strings.Fields(string(out)), " "), errText(err)) {
		return nil
	}
	if err := r.loadDevices(); err != nil {
		return err
	}
	r.perDevice()
	r.oneSeeingBoth()
	return r.killAndEvict()
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// loadDevices reads the mount's devices from stats.json.
func (r *mgRun) loadDevices() error {
	b, err := os.ReadFile(r.m.path(".gdsfs/stats.json"))
	if err != nil {
		return err
	}
	var st struct {
		Devices []mgDevice `json:"devices"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return err
	}
	if len(st.Devices) < 2 {
		return fmt.Errorf("the mount stages onto %d devices, want 2", len(st.Devices))
	}
	r.devs = st.Devices[:2]
	r.cuda = strings.HasPrefix(r.devs[0].Name, "GPU-")
	return nil
}

// env makes a consumer run on device i: CUDA_VISIBLE_DEVICES of its
// ordinal (the client then names that GPU), or GDSFS_DEVICE=hostN.
func (r *mgRun) env(i int) []string {
	if r.cuda {
		return []string{fmt.Sprintf("CUDA_VISIBLE_DEVICES=%d", r.devs[i].Ordinal)}
	}
	return []string{"GDSFS_DEVICE=" + r.devs[i].Name}
}

// consumer runs multigpu.py MODE with env and returns its leases.
func (r *mgRun) consumer(env []string, mode string, args ...string) ([]mgLease, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Minute)
	defer cancel()
	cmd := r.py.command(ctx, r.script, append([]string{mode, r.m.path(r.rel)}, args...)...)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("multigpu.py %s %v: %v: %s", mode, env, err, lastLines(stderr.String(), 4))
	}
	var res struct {
		Leases []mgLease `json:"leases"`
	}
	return res.Leases, lastJSONLine(stdout.Bytes(), &res)
}

// leaseOK checks one lease: on device, local, the file's bytes.
func (r *mgRun) leaseOK(name string, l mgLease, device string, sum bool) bool {
	ok := strings.EqualFold(l.Device, device) && l.Local && (!sum || l.Sha256 == r.want)
	bytes := "not hashed"
	if sum {
		bytes = fmt.Sprintf("sha256 matches the file: %v", l.Sha256 == r.want)
	}
	return r.check(name, ok, "asked %s, got %s, mapped there (local): %v, %s", l.Asked, l.Device, l.Local, bytes)
}

// perDevice: a consumer on each device at once gets the replica there.
func (r *mgRun) perDevice() {
	type answer struct {
		ls  []mgLease
		err error
	}
	ch := make([]chan answer, len(r.devs))
	for i := range r.devs {
		ch[i] = make(chan answer, 1)
		go func() {
			ls, err := r.consumer(r.env(i), "one")
			ch[i] <- answer{ls, err}
		}()
	}
	for i, d := range r.devs {
		a := <-ch[i]
		name := fmt.Sprintf("a consumer on device %d only (%s)", i, r.env(i)[0])
		if a.err != nil || len(a.ls) != 1 {
			r.check(name, false, "%v %v", a.err, a.ls)
			continue
		}
		r.leaseOK(name, a.ls[0], d.Name, true)
	}
}

// oneSeeingBoth: one process seeing both devices leases on each.
func (r *mgRun) oneSeeingBoth() {
	ls, err := r.consumer(nil, "both", r.devs[0].Name, r.devs[1].Name)
	if err != nil || len(ls) != 2 {
		r.check("one process seeing both devices", false, "%v %v", err, ls)
		return
	}
	for i, d := range r.devs {
		r.leaseOK(fmt.Sprintf("one process seeing both, lease on device %d", i), ls[i], d.Name, true)
	}
}

// holder is a consumer holding its lease until its stdin closes.
type mgHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ended bool
}

func (r *mgRun) hold(i int) (*mgHolder, mgLease, error) {
	cmd := r.py.command(r.ctx, r.script, "hold", r.m.path(r.rel))
	cmd.Env = append(cmd.Env, r.env(i)...)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, mgLease{}, err
	}
	h := &mgHolder{cmd: cmd, stdin: stdin}
	var res struct {
		Leases []mgLease `json:"leases"`
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		if line == "held" && len(res.Leases) == 1 {
			go io.Copy(io.Discard, stdout)
			return h, res.Leases[0], nil
		}
		if strings.HasPrefix(line, "{") {
			json.Unmarshal([]byte(line), &res)
		}
	}
	h.end(true)
	return nil, mgLease{}, fmt.Errorf("holder on device %d exited before holding", i)
}

// end kills the holder or lets it release and exit.
func (h *mgHolder) end(kill bool) {
	if h.ended {
		return
	}
	h.ended = true
	if kill {
		h.cmd.Process.Kill()
	}
	h.stdin.Close()
	h.cmd.Wait()
}

// pinned waits until the daemon's leases_active is the sum of want (a
// consumer's end reaches the daemon when its connection closes; its
// leases are released before the counter drops), at most 30 s, then
// compares each device's leases_pinned with want; false with what was
// there.
func (r *mgRun) pinned(want ...int) (bool, []int) {
	var total int64
	for _, n := range want {
		total += int64(n)
	}
	w, err := dialWaiter(r.m.socket, r.m.d.exited)
	if err != nil {
		return false, nil
	}
	defer w.close()
	err = w.count(r.ctx, proto.StatLeasesActive, total, 30*time.Second)
	if lerr := r.loadDevices(); lerr != nil {
		return false, nil
	}
	got := make([]int, 0, len(r.devs))
	same := err == nil
	for i, d := range r.devs {
		got = append(got, d.Pinned)
		same = same && d.Pinned == want[i]
	}
	return same, got
}

// killAndEvict: a killed consumer frees only its leases; evicting one
// replica leaves the other served.
func (r *mgRun) killAndEvict() error {
	var hs []*mgHolder
	for i, d := range r.devs {
		h, l, err := r.hold(i)
		if err != nil {
			return err
		}
		defer h.end(true)
		hs = append(hs, h)
		r.leaseOK(fmt.Sprintf("holder on device %d", i), l, d.Name, false)
	}
	if ok, got := r.pinned(1, 1); !r.check("each holder pins its device's replica", ok, "leases_pinned %v, want [1 1]", got) {
		return nil
	}
	hs[0].end(true)
	ok, got := r.pinned(0, 1)
	r.check("killing device 0's holder frees only its lease", ok, "leases_pinned %v, want [0 1]", got)

	before, err := r.m.stats()
	if err != nil {
		return err
	}
	line := fmt.Sprintf("%s\tgpus=%d", r.rel, r.devs[0].Ordinal)
	if err := os.WriteFile(r.m.path(".gdsfs/evict"), []byte(line+"\n"), 0); !r.check("evict device 0's replica", err == nil, "%q: %v", line, err) {
		return nil
	}
	ls, err := r.consumer(r.env(1), "one")
	if err != nil || len(ls) != 1 {
		r.check("device 1's replica served after device 0's eviction", false, "%v %v", err, ls)
		return nil
	}
	after, err := r.m.stats()
	if err != nil {
		return err
	}
	r.leaseOK("device 1's replica served after device 0's eviction", ls[0], r.devs[1].Name, true)
	r.check("no new load for it", statInt(after, "misses") == statInt(before, "misses") && statInt(after, "evictions") == statInt(before, "evictions")+1,
		"misses %d -> %d, evictions %d -> %d", statInt(before, "misses"), statInt(after, "misses"), statInt(before, "evictions"), statInt(after, "evictions"))
	hs[1].end(false)
	return nil
}
