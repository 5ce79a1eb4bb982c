// Package check is `gdsfs check`: what this machine offers gdsfs, with a
// one-line verdict first ("GDS: ...; cuFile compat: ...; POSIX path: ...;
// staging device: ..."), then every field it learned (or "unknown (why)"),
// each failure said once, and what a user would change to get the faster
// path. The verdict's "works" are measured: a file in the checked
// directory is staged by each path and read back.
//
// It changes nothing on the machine: it writes one temporary file in the
// checked directory and removes it.
package check
