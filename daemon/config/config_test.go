package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gdsfs/gdsfs"
)

func TestDefaultIsValid(t *testing.T) {
	c, err := Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.FUSE.ReadOnly || c.FUSE.Passthrough != "auto" || c.FUSE.MaxRead != 1<<20 ||
		c.Staging.Capacity.Percent != 50 || c.IO.TaskSize != 16<<20 || c.IPC.AcquireTimeout != time.Minute {
		t.Fatalf("defaults not as documented: %+v", c)
	}
}

// Every key of the typed configuration appears in the documented config.yaml.
func TestConfigYAMLDocumentsEveryKey(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(gdsfs.DefaultConfig, &doc); err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := prefix + n.Content[i].Value
			documented[k] = true
			if n.Content[i+1].Kind == yaml.MappingNode {
				walk(n.Content[i+1], k+".")
			}
		}
	}
	walk(doc.Content[0], "")
	var check func(t reflect.Type, prefix string)
	check = func(typ reflect.Type, prefix string) {
		for i := range typ.NumField() {
			tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ",")
			key := prefix + tag
			if !documented[key] {
				t.Errorf("config.yaml does not document %s", key)
			}
			if isSection(typ.Field(i).Type) {
				check(typ.Field(i).Type, key+".")
			}
		}
	}
	check(reflect.TypeFor[Config](), "")
}

func TestEffectiveConfigRoundTrips(t *testing.T) {
	c, err := Load("", []string{"staging.capacity=3GiB", "staging.gpus=[1,2]", "io.num_threads=4"})
	if err != nil {
		t.Fatal(err)
	}
	back := &Config{}
	if err := apply(back, c.YAML()); err != nil {
		t.Fatalf("printed config does not load: %v\n%s", err, c.YAML())
	}
	if !reflect.DeepEqual(c, back) {
		t.Fatalf("round trip differs:\n%+v\n%+v", c, back)
	}
}

func TestFileOverlayAndSet(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("fuse:\n  read_only: false\nstaging:\n  gpus: [3]\n  exclude: ['*.tmp']\n"), 0o644)
	c, err := Load(f, []string{"staging.capacity=25%", "fuse.passthrough=off"})
	if err != nil {
		t.Fatal(err)
	}
	if c.FUSE.ReadOnly || !reflect.DeepEqual(c.Staging.GPUs, []int{3}) || c.Staging.Capacity.Percent != 25 ||
		c.FUSE.Passthrough != "off" || !c.IO.NumThreads.Auto() || len(c.Staging.Exclude) != 1 {
		t.Fatalf("overlay wrong: %+v", c)
	}
}

// TestMaxConnectionsAloneBoundsEachUID: setting ipc.max_connections alone
// leaves each uid a quarter of it.
func TestMaxConnectionsAloneBoundsEachUID(t *testing.T) {
	c, err := Load("", []string{"ipc.max_connections=256"})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.IPC.ConnectionsPerUID(); n != 64 {
		t.Fatalf("ipc.max_connections 256: %d connections per uid, want 64", n)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	n := 0
	write := func(body string) string {
		n++
		f := filepath.Join(dir, fmt.Sprintf("c%d.yaml", n))
		os.WriteFile(f, []byte(body), 0o644)
		return f
	}
	for _, tc := range []struct {
		file string
		sets []string
		want string
	}{
		{"", []string{"fuse.readonly=true"}, "unknown key fuse.readonly"},
		{"", []string{"nosuch.key=1"}, "unknown key nosuch"},
		{"", []string{"staging.capacity=lots"}, `staging.capacity: bad size "lots"`},
		{"", []string{"staging.capacity=0%"}, "staging.capacity: bad percentage"},
		{"", []string{"io.num_threads=many"}, `io.num_threads: want a whole number above 0 or auto, got "many"`},
		{"", []string{"io.num_threads=0"}, "io.num_threads: want a whole number above 0 or auto"},
		{"", []string{"io.num_threads=300"}, "io.num_threads: 300 is outside"},
		{"", []string{"io.bounce_size=0"}, "io.bounce_size: want a size above 0, or auto"},
		{"", []string{"io.bounce_size=lots"}, "io.bounce_size: bad size"},
		{"", []string{"fuse.passthrough=maybe"}, `fuse.passthrough: "maybe" is not one of`},
		{"", []string{"fuse.attr_timeout=soon"}, "fuse.attr_timeout: want a duration"},
		{"", []string{"staging=1"}, "staging is a section"},
		{"", []string{"novalue"}, "want key=value"},
		{"", []string{"ipc.sharing=public"}, `ipc.sharing: "public"`},
		{"", []string{"log.format=xml"}, `log.format: "xml"`},
		{"", []string{"shutdown.handover_timeout=0s"}, "shutdown.handover_timeout: 0s is not positive"},
		{"", []string{"ipc.max_connections=256", "ipc.max_connections_per_uid=1024"}, "ipc.max_connections_per_uid: 1024 is more than half of ipc.max_connections (256)"},
		{"", []string{"staging.device=tpu"}, `staging.device: "tpu"`},
		{"", []string{"staging.gpus=[]"}, "staging.gpus: empty"},
		{"", []string{"io.task_size=1000"}, "io.task_size"},
		{write("fuse:\n  bogus: 1\n"), nil, "unknown key fuse.bogus"},
		{write("fuse: 3\n"), nil, "fuse: want a mapping"},
		{write("fuse:\n  read_only: [1]\n"), nil, "fuse.read_only: want a bool, got a list"},
		{write("fuse: [\n"), nil, "not valid YAML"},
		{filepath.Join(dir, "missing.yaml"), nil, "missing.yaml"},
	} {
		_, err := Load(tc.file, tc.sets)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%q, %q) = %v, want an error containing %q", tc.file, tc.sets, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error is not one line: %q", err)
		}
	}
}
