package gdsfs

// Tests that keep the documentation honest: every relative link in the
// README and docs/ resolves, the README stays a README, the docs carry no
// dates or issue numbers, and docs/configuration.md is config.yaml's
// comments, regenerated with `go test -run TestConfigurationDoc -update .`.

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from config.yaml")

// readmeMaxLines bounds the README: what it is, the two set-up commands, a
// short tour and links. Anything longer belongs in docs/.
const readmeMaxLines = 200

// docFiles is the README and every docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no docs/*.md found: run the test from the repository root")
	}
	return append([]string{"README.md"}, files...)
}

func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into docs/ and link it", n, readmeMaxLines)
	}
}

func TestDocLinksResolve(t *testing.T) {
	for _, f := range docFiles(t) {
		for _, p := range brokenLinks(t, f) {
			t.Errorf("%s", p)
		}
	}
}

// TestDocLinkCheckerFindsBrokenLinks feeds the checker a document with one
// good and several broken links, so the check above cannot pass by finding
// nothing.
func TestDocLinkCheckerFindsBrokenLinks(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("other.md", "# Other page\n\n## A section, with punctuation!\n")
	write("doc.md", strings.Join([]string{
		"# Doc",
		"[good](other.md) [good anchor](other.md#a-section-with-punctuation)",
		"[own](#doc) [web](https://example.com/x.md)",
		"`[in code](missing-in-code.md)`",
		"```",
		"[in a block](missing-in-block.md)",
		"```",
		"[missing file](missing.md)",
		"[missing anchor](other.md#no-such-section)",
		"[missing own anchor](#nowhere)",
	}, "\n"))
	got := brokenLinks(t, filepath.Join(dir, "doc.md"))
	want := []string{"missing.md", "other.md#no-such-section", "#nowhere"}
	if len(got) != len(want) {
		t.Fatalf("broken links found: %q, want exactly %q", got, want)
	}
	for i, w := range want {
		if !strings.Contains(got[i], "("+w+")") {
			t.Errorf("finding %d = %q, want one naming %q", i, got[i], w)
		}
	}
}

var (
	linkRE      = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE  = regexp.MustCompile("`[^`\n]*`")
	schemeRE    = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	headingRE   = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	datedRE     = regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)
	issueRefRE  = regexp.MustCompile(`(?i)\bissue[- ]?#?[0-9]+|(^|[\s(])#[0-9]+\b`)
	afterFixRE  = regexp.MustCompile(`(?i)after the fix|before the fix|the old code|the old binary`)
	anchorStrip = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// prose returns the lines of a markdown file with fenced code blocks
// blanked and code spans emptied, so line i+1 of the file is prose[i].
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fence := false
	for i, line := range lines {
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "```"):
			fence = !fence
			lines[i] = ""
		case fence:
			lines[i] = ""
		default:
			lines[i] = codeSpanRE.ReplaceAllString(line, "``")
		}
	}
	return lines
}

// anchors returns the GitHub anchors of a markdown file's headings.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		h := strings.ToLower(strings.ReplaceAll(m[1], "`", ""))
		h = anchorStrip.ReplaceAllString(h, "")
		h = strings.Map(func(r rune) rune {
			if unicode.IsSpace(r) {
				return '-'
			}
			return r
		}, h)
		a := h
		if n := seen[h]; n > 0 {
			a = fmt.Sprintf("%s-%d", h, n)
		}
		seen[h]++
		out[a] = true
	}
	return out
}

// brokenLinks lists the relative links of a markdown file that name a file
// that does not exist or a heading its target lacks.
func brokenLinks(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, line := range prose(string(b)) {
		n := i + 1
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if schemeRE.MatchString(target) {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
			}
			st, err := os.Stat(dest)
			if err != nil {
				out = append(out, fmt.Sprintf("%s:%d: link (%s): %v", file, n, target, err))
				continue
			}
			if frag == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(dest, ".md") {
				out = append(out, fmt.Sprintf("%s:%d: link (%s): an anchor into a file that is not markdown", file, n, target))
				continue
			}
			db, err := os.ReadFile(dest)
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(db))[frag] {
				out = append(out, fmt.Sprintf("%s:%d: link (%s): %s has no heading with anchor #%s", file, n, target, dest, frag))
			}
		}
	}
	return out
}

// TestDocsSayWhatIsTrueNow: history (dates, issue numbers, "after the fix")
// belongs in commit messages, not in the docs.
func TestDocsSayWhatIsTrueNow(t *testing.T) {
	files := append(docFiles(t), "config.yaml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range prose(string(b)) {
			n := i + 1
			for _, re := range []*regexp.Regexp{datedRE, issueRefRE, afterFixRE} {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d: %q: docs state what is true now; history goes in commit messages", f, n, strings.TrimSpace(m))
				}
			}
		}
	}
}

const (
	configDoc   = "docs/configuration.md"
	configBegin = "<!-- generated from config.yaml by `go test -run TestConfigurationDoc -update .`: edit config.yaml, not this list -->"
	configEnd   = "<!-- end of generated list -->"
)

// TestConfigurationDoc checks that docs/configuration.md lists every key
// of config.yaml with its default and comment, as config.yaml has them.
func TestConfigurationDoc(t *testing.T) {
	want := renderConfig(t, DefaultConfig)
	b, err := os.ReadFile(configDoc)
	if err != nil && !*update {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, configBegin), strings.Index(doc, configEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q and %q around the generated list", configDoc, configBegin, configEnd)
	}
	got := doc[i+len(configBegin) : j]
	if got == want {
		return
	}
	if *update {
		doc = doc[:i+len(configBegin)] + want + doc[j:]
		if err := os.WriteFile(configDoc, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is out of date with config.yaml: run `go test -run TestConfigurationDoc -update .`", configDoc)
}

// renderConfig writes config.yaml's keys as markdown: a section per
// top-level key, one item per group of keys sharing a comment.
func renderConfig(t *testing.T, src []byte) string {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal(src, &root); err != nil {
		t.Fatalf("config.yaml: %v", err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		t.Fatal("config.yaml: not a mapping")
	}
	var sb strings.Builder
	sb.WriteString("\n")
	top := root.Content[0].Content
	for i := 0; i+1 < len(top); i += 2 {
		section, body := top[i], top[i+1]
		if body.Kind != yaml.MappingNode {
			t.Fatalf("config.yaml: %s is not a section", section.Value)
		}
		fmt.Fprintf(&sb, "\n### %s\n\n", section.Value)
		var keys []string
		flush := func(comment string) {
			if len(keys) == 0 {
				return
			}
			fmt.Fprintf(&sb, "- %s", strings.Join(keys, ", "))
			if comment != "" {
				fmt.Fprintf(&sb, ": %s", comment)
			}
			sb.WriteString("\n")
			keys = nil
		}
		comment := ""
		for k := 0; k+1 < len(body.Content); k += 2 {
			key, val := body.Content[k], body.Content[k+1]
			if c := commentText(key.HeadComment); c != "" {
				flush(comment)
				comment = c
			}
			keys = append(keys, fmt.Sprintf("`%s.%s` (default `%s`)", section.Value, key.Value, valueText(val)))
		}
		flush(comment)
	}
	sb.WriteString("\n")
	return sb.String()
}

func commentText(c string) string {
	var words []string
	for _, line := range strings.Split(c, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if line != "" {
			words = append(words, line)
		}
	}
	return strings.Join(words, " ")
}

func valueText(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		var vs []string
		for _, c := range n.Content {
			vs = append(vs, valueText(c))
		}
		return "[" + strings.Join(vs, ", ") + "]"
	case yaml.ScalarNode:
		if n.Value == "" {
			return `""`
		}
		return n.Value
	}
	return "?"
}
