package client

import (
	"fmt"
	"os"

	"github.com/gdsfs/gdsfs/client/chunkmap"
	"github.com/gdsfs/gdsfs/proto"
)

// mapGrant maps the chunks of g (files, in order): read-only unless the
// grant is private. A grant whose descriptors or size do not fit its
// chunks is the daemon's protocol error.
func mapGrant(g *proto.Grant, files []*os.File) (chunkmap.Mapping, error) {
	lens := g.ChunkLens()
	if len(files) == 0 || len(files) != len(lens) {
		return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("%d descriptors for %d chunks", len(files), len(lens))}
	}
	var total int64
	for _, n := range lens {
		total += n
	}
	if g.Size < 0 || g.Size > total {
		return nil, &Error{Code: proto.EPROTO, Msg: fmt.Sprintf("size %d outside chunks of %d bytes", g.Size, total)}
	}
	return chunkmap.Map(g.Device, files, lens, g.Size, g.Sharing == proto.SharingPrivate)
}
