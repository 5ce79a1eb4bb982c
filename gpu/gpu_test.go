package gpu

import (
	"reflect"
	"testing"
)

func TestSplitChunks(t *testing.T) {
	for _, tc := range []struct {
		size, chunk, gran int64
		want              []int64
	}{
		{0, 1 << 20, 4096, []int64{4096}},
		{1, 1 << 20, 4096, []int64{4096}},
		{4096, 1 << 20, 4096, []int64{4096}},
		{3<<20 + 5, 1 << 20, 4096, []int64{1 << 20, 1 << 20, 1 << 20, 4096}},
		{10, 1000, 4096, []int64{4096}},
		{5 << 21, 3 << 21, 2 << 20, []int64{6 << 20, 4 << 20}},
	} {
		got := SplitChunks(tc.size, tc.chunk, tc.gran)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("SplitChunks(%d, %d, %d) = %v, want %v", tc.size, tc.chunk, tc.gran, got, tc.want)
		}
		var sum int64
		for _, c := range got {
			if c%tc.gran != 0 {
				t.Errorf("chunk %d not a multiple of %d", c, tc.gran)
			}
			sum += c
		}
		if sum < tc.size {
			t.Errorf("chunks %v hold less than %d", got, tc.size)
		}
	}
}
