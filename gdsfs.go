// Package gdsfs holds what the whole project shares: the documented default
// configuration (config.yaml, embedded) and the version.
package gdsfs

import _ "embed"

// DefaultConfig is config.yaml at the repository root: every key, commented.
//
//go:embed config.yaml
var DefaultConfig []byte

// Version is set at link time (-ldflags "-X github.com/gdsfs/gdsfs.Version=...").
var Version = "dev"
