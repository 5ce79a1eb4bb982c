package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// object is one manifest document, decoded strictly into its API type.
type object struct {
	file string
	kind string
	obj  any
}

// load decodes every document of every manifest beside this package.
func load(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("../*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in ..: %v", err)
	}
	var out []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			o, err := decode([]byte(doc))
			if err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
				continue
			}
			o.file = filepath.Base(f)
			out = append(out, o)
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decode converts YAML to JSON (rejecting duplicate keys) and decodes it
// into the type of its apiVersion and kind as the API server does.
func decode(doc []byte) (object, error) {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return object{}, err
	}
	var meta struct{ APIVersion, Kind string }
	if err := json.Unmarshal(js, &meta); err != nil {
		return object{}, err
	}
	var obj any
	switch meta.APIVersion + " " + meta.Kind {
	case "v1 Namespace":
		obj = &corev1.Namespace{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1 Pod":
		obj = &corev1.Pod{}
	case "apps/v1 DaemonSet":
		obj = &appsv1.DaemonSet{}
	default:
		return object{}, fmt.Errorf("apiVersion %q kind %q: not a type this check knows", meta.APIVersion, meta.Kind)
	}
	// The API server's decoding: case-sensitive field names, no unknown
	// or duplicate fields.
	strict, err := kjson.UnmarshalStrict(js, obj)
	if err = errors.Join(append(strict, err)...); err != nil {
		return object{}, fmt.Errorf("%s %s: %w", meta.APIVersion, meta.Kind, err)
	}
	return object{kind: meta.Kind, obj: obj}, nil
}

func find[T any](t *testing.T, objs []object) T {
	t.Helper()
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T among the manifests", zero)
	return zero
}

// A misspelt field must fail: the check is only worth something if it
// would catch one.
func TestStrictDecodingCatchesTypos(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: a, image: b, volumeMount: []}]\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {selector: {}, template: {spec: {hostPid: true}}}\n",
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nmetadata: {name: y}\n",
	} {
		if _, err := decode([]byte(doc)); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	objs := load(t)
	ds := find[*appsv1.DaemonSet](t, objs)
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the daemon must be privileged (FUSE mount, Bidirectional propagation)")
	}
	if !spec.HostPID {
		t.Error("hostPID: the lease server must see client pids of other pods")
	}
	if !selects(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Error("the selector does not match the template's labels")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	vols := hostPaths(spec.Volumes)
	want := []struct {
		path, host string
		prop       corev1.MountPropagationMode
	}{
		{"/dev/fuse", "/dev/fuse", ""},
		{"/gds", "/gds", corev1.MountPropagationBidirectional},
		{"/run/gdsfs", "/run/gdsfs", ""},
	}
	for _, w := range want {
		m, ok := mounts[w.path]
		if !ok {
			t.Errorf("no volume mounted at %s", w.path)
			continue
		}
		if vols[m.Name] != w.host {
			t.Errorf("%s: volume %s is hostPath %q, want %q", w.path, m.Name, vols[m.Name], w.host)
		}
		if w.prop != "" && (m.MountPropagation == nil || *m.MountPropagation != w.prop) {
			t.Errorf("%s: mount propagation %v, want %s", w.path, m.MountPropagation, w.prop)
		}
	}
	args := strings.Join(c.Args, " ")
	if !strings.HasPrefix(args, "mount ") || !strings.Contains(args, "ipc.socket=/run/gdsfs/") || !strings.HasSuffix(args, " /gds/datasets") {
		t.Errorf("args %q: want gdsfs mount with the socket under /run/gdsfs and the mount under /gds", args)
	}
	grace := spec.TerminationGracePeriodSeconds
	if grace == nil || *grace <= 30 {
		t.Errorf("terminationGracePeriodSeconds %v: must exceed shutdown.grace (30s)", grace)
	}
	cm := find[*corev1.ConfigMap](t, objs)
	cfg := cm.Data["config.yaml"]
	var parsed map[string]any
	if err := yaml.UnmarshalStrict([]byte(cfg), &parsed); err != nil {
		t.Fatalf("ConfigMap config.yaml: %v", err)
	}
	if !strings.Contains(cfg, "allow_other: true") {
		t.Error("config.yaml: pods run as other users: fuse.allow_other must be true")
	}
	checkMetricsPrivate(t, parsed, ds)
}

// checkMetricsPrivate: the unauthenticated metrics endpoint listens on the
// pod's loopback only, and nothing advertises it on the pod network.
func checkMetricsPrivate(t *testing.T, cfg map[string]any, ds *appsv1.DaemonSet) {
	t.Helper()
	m, _ := cfg["metrics"].(map[string]any)
	listen, _ := m["listen"].(string)
	if listen != "" {
		host, _, err := net.SplitHostPort(listen)
		ip := net.ParseIP(host)
		if err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("config.yaml metrics.listen %q: must be a loopback address (plain HTTP, no authentication)", listen)
		}
	}
	spec := ds.Spec.Template.Spec
	if spec.HostNetwork {
		t.Error("the daemon must not share the host's network: its loopback would be the node's")
	}
	for _, c := range spec.Containers {
		for _, p := range c.Ports {
			t.Errorf("container %s advertises port %d (%s): the daemon serves nothing on the pod network", c.Name, p.ContainerPort, p.Name)
		}
	}
	for k := range ds.Spec.Template.Annotations {
		if strings.HasPrefix(k, "prometheus.io/") {
			t.Errorf("annotation %s: Prometheus cannot scrape a loopback endpoint", k)
		}
	}
}

func TestTrainingPod(t *testing.T) {
	pod := find[*corev1.Pod](t, load(t))
	spec := pod.Spec
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Error("the training pod must run as a non-root user")
	}
	if spec.HostPID || spec.HostNetwork {
		t.Error("the training pod must not share host namespaces")
	}
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged ||
		c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
		t.Error("the training container must be unprivileged without privilege escalation")
	}
	if q, ok := c.Resources.Limits["nvidia.com/gpu"]; !ok || q.Value() < 1 {
		t.Error("the training pod must ask for a GPU (nvidia.com/gpu)")
	}
	vols := hostPaths(spec.Volumes)
	var sawMount, sawSocket bool
	for _, m := range c.VolumeMounts {
		switch vols[m.Name] {
		case "/gds":
			sawMount = m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationHostToContainer
		case "/run/gdsfs":
			sawSocket = m.MountPath == "/run/gdsfs" // where MOUNT/.gdsfs/socket points
			if !m.ReadOnly {
				t.Error("the pod must mount /run/gdsfs read-only: clients only connect to the socket")
			}
		}
	}
	if !sawMount {
		t.Error("the pod must mount hostPath /gds with HostToContainer propagation")
	}
	if !sawSocket {
		t.Error("the pod must mount hostPath /run/gdsfs at /run/gdsfs (the socket path the mount names)")
	}
}

func hostPaths(vols []corev1.Volume) map[string]string {
	out := map[string]string{}
	for _, v := range vols {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}
