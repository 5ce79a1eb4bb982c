package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
)

// Every command's long help is its embedded markdown file; `gdsfs man`
// writes one page per command from that text.
func TestManFromCommandDocs(t *testing.T) {
	for _, tc := range []struct {
		cmd  string
		help string
	}{
		{"mount", mountHelp}, {"umount", umountHelp}, {"stats", statsHelp},
		{"warmup", warmupHelp}, {"check", checkHelp}, {"run", runHelp},
	} {
		if strings.TrimSpace(tc.help) == "" {
			t.Errorf("%s.md is empty", tc.cmd)
		}
		c, _, err := rootCmd().Find([]string{tc.cmd})
		if err != nil || c.Long != tc.help {
			t.Errorf("gdsfs %s: Long is not %s.md (%v)", tc.cmd, tc.cmd, err)
		}
	}
	dir := t.TempDir()
	root := rootCmd()
	root.SetArgs([]string{"man", "--dir", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.IsAvailableCommand() && c != root {
			return
		}
		page := filepath.Join(dir, strings.ReplaceAll(c.CommandPath(), " ", "-")+".8")
		b, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("no man page for %q: %v", c.CommandPath(), err)
			return
		}
		first, _, _ := strings.Cut(c.Long, "\n")
		if first != "" && !strings.Contains(letters(string(b)), letters(first)) {
			t.Errorf("%s does not hold its help's first line %q", page, first)
		}
	}
	walk(root)
}

// letters is s with only its letters and digits, for comparing text
// with a page where go-md2man escaped and formatted it.
func letters(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			return r
		}
		return -1
	}, s)
}
