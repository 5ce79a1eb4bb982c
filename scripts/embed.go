// Package scripts embeds the GPU measurement scripts that `gdsfs bench`
// runs (autoload-gpu.py for `bench autoload`, readahead-gpu.py for
// `bench readahead`) and gpuscript.py, which they import, so the binary
// carries them. The .py files stay plain scripts beside this file: they can
// be run on their own, and this package only reads them.
package scripts

import _ "embed"

// Autoload is autoload-gpu.py: unmodified loaders plain vs under `gdsfs run`.
//
//go:embed autoload-gpu.py
var Autoload []byte

// Readahead is readahead-gpu.py: a DataLoader over leased shards with
// read-ahead off, on and replaying a trace.
//
//go:embed readahead-gpu.py
var Readahead []byte

// Shared is gpuscript.py, what the scripts share, imported from beside
// them.
//
//go:embed gpuscript.py
var Shared []byte
