package metrics

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

func TestCuFileServedAsMetrics(t *testing.T) {
	stats := map[string]any{
		"opens": float64(1),
		"cufile": map[string]any{
			"statistics": "level 3", "level": float64(3), "attribution": "mismatch gdsfs=1 cufile=2 on GPU-a",
			"read_bytes": float64(8192), "read_ops": float64(2), "read_errors": float64(1),
			"gpus": []any{map[string]any{"name": "GPU-a", "index": float64(0), "read_bytes": float64(8192),
				"reads": float64(2), "nvfs_reads": float64(0), "posix_reads": float64(2), "p2p_reads": float64(0),
				"read_errors": float64(1)}},
		},
	}
	fams := scrape(t, New(func() map[string]any { return stats }))
	series := func(name string, labels map[string]string) *dto.Metric {
		f := fams[name]
		if f == nil {
			t.Errorf("%s not served", name)
			return nil
		}
	next:
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			if len(m.Label) == len(labels) {
				return m
			}
		}
		t.Errorf("%s has no series %v", name, labels)
		return nil
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gdsfs_cufile_read_bytes_total", nil, 8192},
		{"gdsfs_cufile_read_errors_total", nil, 1},
		{"gdsfs_cufile_gpu_read_bytes_total", map[string]string{"gpu": "GPU-a"}, 8192},
		{"gdsfs_cufile_gpu_reads_total", map[string]string{"gpu": "GPU-a", "path": "posix"}, 2},
		{"gdsfs_cufile_gpu_reads_total", map[string]string{"gpu": "GPU-a", "path": "nvfs"}, 0},
		{"gdsfs_cufile_statistics_level", nil, 3},
		{"gdsfs_cufile_attribution", map[string]string{"state": "mismatch"}, 1},
	} {
		if m := series(tc.name, tc.labels); m != nil && value(m) != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, value(m), tc.want)
		}
	}
	for _, l := range fams["gdsfs_info"].Metric[0].Label {
		if l.GetName() == "cufile" || l.GetName() == "attribution" {
			t.Errorf("gdsfs_info carries %s", l.GetName())
		}
	}
}
