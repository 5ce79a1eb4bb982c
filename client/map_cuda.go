package client

import (
	"os"

	"github.com/gdsfs/gdsfs/gpu/cuda"
)

// mapCUDA imports the chunks on the GPU named device and maps them into one
// device address range.
func mapCUDA(device string, files []*os.File, lens []int64, size int64) (mapping, error) {
	m, err := cuda.Map(device, files, lens)
	if err != nil {
		return nil, err
	}
	return m, nil
}
