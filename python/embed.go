// Package python embeds the gdsfs Python package (client, autoloader and
// the sitecustomize bootstrap) so that `gdsfs run` works from a binary
// installed anywhere: it unpacks these files into a directory private to
// the caller (see docs/run.md).
package python

import "embed"

// Files holds sitecustomize.py (the bootstrap) and gdsfs/ (Python
// sources and VERSION, the release the binary reports too).
//
//go:embed sitecustomize.py gdsfs/VERSION gdsfs/*.py gdsfs/autoload/*.py gdsfs/_bootstrap/*.py
var Files embed.FS
