package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gdsfs/gdsfs/proto"
)

// checkReplicas checks, after waitStaged, that every file has a
// resident replica on every device devs names (none: nothing to check),
// from each mount's .gdsfs/cache.json.
func checkReplicas(files []warmFile, devs []string) error {
	if len(devs) == 0 || len(files) == 0 {
		return nil
	}
	var missing []string
	names := map[string][]string{} // mount -> device names
	resident := map[string]map[string]bool{}
	for _, f := range files {
		if _, ok := names[f.mnt]; !ok {
			n, err := deviceNames(f.mnt, devs)
			if err != nil {
				return err
			}
			names[f.mnt] = n
			if resident[f.mnt], err = residentReplicas(f.mnt); err != nil {
				return err
			}
		}
		for _, d := range names[f.mnt] {
			if !resident[f.mnt][f.rel+"\x00"+strings.ToLower(d)] {
				missing = append(missing, f.rel+" on "+d)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("warmup: %d replicas not resident: %s", len(missing), strings.Join(missing, "; "))
	}
	fmt.Fprintf(os.Stderr, "replicas resident on %s\n", strings.Join(names[files[0].mnt], ", "))
	return nil
}

// deviceNames resolves devs (ordinals, names, all) against the mount's
// devices, as its stats.json lists them.
func deviceNames(mnt string, devs []string) ([]string, error) {
	st, err := readStatsJSON(mnt)
	if err != nil {
		return nil, err
	}
	list, _ := st["devices"].([]any)
	byOrdinal := map[string]string{}
	var all []string
	for _, v := range list {
		m, _ := v.(map[string]any)
		name, _ := m["name"].(string)
		ord, _ := m["ordinal"].(float64)
		byOrdinal[strconv.Itoa(int(ord))] = name
		all = append(all, name)
	}
	var out []string
	for _, d := range devs {
		switch {
		case strings.EqualFold(d, "all"):
			return all, nil
		case byOrdinal[d] != "":
			out = append(out, byOrdinal[d])
		default:
			out = append(out, d)
		}
	}
	return out, nil
}

// residentReplicas reads the mount's .gdsfs/cache.json: path and device
// of every resident replica, as "path\x00device".
func residentReplicas(mnt string) (map[string]bool, error) {
	name := filepath.Join(mnt, ".gdsfs", "cache.json")
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var l cacheListing
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	out := map[string]bool{}
	for _, e := range l.Entries {
		if e.State == proto.StateResident {
			out[e.Path+"\x00"+strings.ToLower(e.Device)] = true
		}
	}
	return out, nil
}
