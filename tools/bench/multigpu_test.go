package bench

import (
	"testing"

	"github.com/gdsfs/gdsfs/gpu"
)

// The targets of bench multigpu from one run's figures: split ingest
// against staging twice (time), two files at once against 1.6 x one GPU
// or the host memcpy rate, whichever is lower; n/a on the host backend.
func TestMultiGPUChecks(t *testing.T) {
	res := &multiGPUResult{
		Kind:      gpu.KindCUDA,
		Baselines: []mgRow{{Name: mgMemcpy, GBps: 60}},
		Stagings: []mgRow{
			{Name: mgOne, GBps: 40}, {Name: mgTwice, Seconds: 1}, {Name: mgSplit, Seconds: 0.55}, {Name: mgPair, GBps: 61},
		},
	}
	c := multiGPUChecks(res)
	if c[0].Status != statusPass || c[0].Got != 0.55 || c[1].Status != statusPass || c[1].Want != 60 {
		t.Errorf("%+v", c)
	}
	res.Stagings[2].Seconds, res.Baselines[0].GBps = 0.7, 100
	c = multiGPUChecks(res)
	if c[0].Status != statusMiss || c[1].Status != statusMiss || c[1].Want != 64 {
		t.Errorf("slower split, memcpy above 1.6 x: %+v", c)
	}
	res.Stagings = res.Stagings[:1]
	if c = multiGPUChecks(res); c[0].Status == statusPass || c[1].Status == statusPass {
		t.Errorf("unmeasured rows must not pass: %+v", c)
	}
	res.Kind, res.HostChosen = gpu.KindHost, true
	if c = multiGPUChecks(res); c[0].Status != statusNotHere+whyHost {
		t.Errorf("host chosen: %+v", c)
	}
	res.HostChosen = false
	if c = multiGPUChecks(res); c[0].passes() || c[1].passes() {
		t.Errorf("host where GPUs were meant: %+v", c)
	}
}
