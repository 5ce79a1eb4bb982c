package client

import (
	"os"

	"github.com/gdsfs/gdsfs/gpu/host"
)

// mapChunks maps received chunks: read-only memfd mappings on the host
// backend, a CUDA VMM import otherwise.
func mapChunks(device string, files []*os.File, lens []int64, size int64) (mapping, error) {
	if device == "host" {
		return host.Map(files, lens, size)
	}
	return mapCUDA(device, files, lens, size)
}
