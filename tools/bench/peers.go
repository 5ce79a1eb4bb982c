package bench

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gdsfs/gdsfs/gpu"
)

//go:embed peers.py
var peersScript []byte

// runPeers measures the Python peers on path, warm and (with --cold)
// cold. They need python3 with torch and a GPU; without, one row says why.
func runPeers(path string, dev gpu.Device, o StageOptions, hostChosen bool) []benchRow {
	if dev.Kind() != gpu.KindCUDA {
		why := "they load into GPU memory; " + whyNoGPU
		if hostChosen {
			why = statusNotHere + whyHost
		}
		return []benchRow{{Name: "python peers", Kind: "peer", Why: why}}
	}
	dir, err := os.MkdirTemp("", "gdsfs-bench-peers-") // 0700: no one else's modules beside the script
	if err != nil {
		return []benchRow{{Name: "python peers", Kind: "peer", Why: err.Error()}}
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "peers.py")
	if err := writeNew(script, peersScript, 0o600); err != nil {
		return []benchRow{{Name: "python peers", Kind: "peer", Why: err.Error()}}
	}
	byName := map[string]*benchRow{}
	modes := []string{"warm"}
	if o.Cold {
		modes = append(modes, "cold")
	}
	for _, mode := range modes {
		res, err := runPeerScript(script, path, mode, o.Runs)
		if err != nil {
			return []benchRow{{Name: "python peers", Kind: "peer", Why: err.Error()}}
		}
		for name, r := range res {
			row := byName[name]
			if row == nil {
				row = &benchRow{Name: "peer: " + name, Kind: "peer"}
				byName[name] = row
			}
			if r.Error != "" {
				row.Why = r.Error
			} else if mode == "warm" {
				row.Warm = r.GBps
			} else {
				row.Cold = r.GBps
			}
		}
	}
	var rows []benchRow
	for _, r := range byName {
		rows = append(rows, *r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	return rows
}

type peerResult struct {
	GBps  float64 `json:"gbps"`
	Error string  `json:"error"`
}

func runPeerScript(script, path, mode string, runs int) (map[string]peerResult, error) {
	cmd := exec.Command(pickInterpreter(true), "-I", script, path, mode, fmt.Sprint(runs))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("python3 peers (%s): %v", mode, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res map[string]peerResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return nil, fmt.Errorf("python3 peers (%s): bad output %q", mode, out)
	}
	return res, nil
}
