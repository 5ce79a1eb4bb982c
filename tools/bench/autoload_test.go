package bench

import "testing"

func TestOverheadChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  overheadResult
		ok   bool
	}{
		{"within 2 us, nothing served", overheadResult{Calls: map[string]overheadCall{"copy_": {AddedNs: 400}, "to": {AddedNs: -30}}, IndexEntries: 1}, true},
		{"over 2 us", overheadResult{Calls: map[string]overheadCall{"copy_": {AddedNs: 2001}}, IndexEntries: 1}, false},
		{"no call timed", overheadResult{IndexEntries: 1}, false},
		{"index empty", overheadResult{Calls: map[string]overheadCall{"copy_": {AddedNs: 10}}}, false},
		{"index rebuilt", overheadResult{Calls: map[string]overheadCall{"copy_": {AddedNs: 10}}, IndexEntries: 1, IndexRebuilds: 1}, false},
		{"a call served", overheadResult{Calls: map[string]overheadCall{"copy_": {AddedNs: 10}}, IndexEntries: 1, Served: map[string]int{"torch.Tensor.to": 1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := overheadChecks(&tc.res)
			if err := verdict(checks); (err == nil) != tc.ok {
				t.Errorf("verdict %v, want ok=%v; checks %v", err, tc.ok, checks)
			}
		})
	}
}
