package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"credbroker.dev/e2e/harness"
	"sigs.k8s.io/yaml"
)

// fw is the suite's framework: the peers, the image content, the token plugin, the scratch
// directory and the fleet every scenario on Kueue v0.19.2 shares (a hub and two workers),
// started once by TestMain.
var fw *harness.Framework

const kueueMain = "v0.19.2"

func TestMain(m *testing.M) {
	// The whole suite runs in a network namespace of its own (harness.RunInSuiteNetwork):
	// this process starts that child and passes its exit code on.
	code, inChild, err := harness.RunInSuiteNetwork()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	if !inChild {
		os.Exit(code)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The parent process made the scratch directory (harness.RunInSuiteNetwork) and removes
	// it at the end, unless CREDBROKER_E2E_KEEP=1 keeps every process's log and config.
	if os.Getenv("CREDBROKER_E2E_KEEP") != "" {
		defer func() { fmt.Println("e2e: kept", os.Getenv(harness.ScratchEnv)) }()
	}
	fw = harness.NewFramework(harness.FrameworkOptions{Kueue: kueueMain, Workers: 2})
	defer fw.Stop()
	if err := fw.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	fmt.Printf("e2e: hub and %d workers (kube-apiserver %s, etcd %s, Kueue %s on each worker) up in %.1fs\n",
		len(fw.Fleet.Workers), fw.Peers.KubeVersion, fw.Peers.EtcdVersion, kueueMain, fw.FleetUpIn.Seconds())
	return m.Run()
}

// kueueConfig is the hub's Kueue configuration as the shipped overlay renders it, plus the
// access-provider entries a scenario adds (the shape docs/ gives them).
func kueueConfig(t *testing.T, extra ...map[string]any) map[string]any {
	t.Helper()
	return envKueueConfig(t, fw.Fleet, "accessProviders", extra...)
}

// envKueueConfig is env's rendered hub Kueue configuration with extra entries appended to
// its list (field: accessProviders, or credentialsProviders for Kueue v0.15–v0.18).
func envKueueConfig(t *testing.T, env *harness.Env, field string, extra ...map[string]any) map[string]any {
	t.Helper()
	cfg, err := env.KueueConfig()
	if err != nil {
		t.Fatal(err)
	}
	cp := harness.Sub(harness.Sub(cfg, "multiKueue"), "clusterProfile")
	list, ok := cp[field].([]any)
	if !ok {
		t.Fatalf("the rendered Kueue configuration has no multiKueue.clusterProfile.%s list", field)
	}
	for _, e := range extra {
		list = append(list, e)
	}
	cp[field] = list
	return cfg
}

// workerToken mints a token of the worker identity deploy/examples/worker-rbac binds on c.
func workerToken(t *testing.T, c *harness.Cluster) string {
	t.Helper()
	tok, err := c.WorkerToken(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// shimEntry is an accessProviders entry running the shim for a broker provider, as docs/ write it.
func shimEntry(name, provider string) map[string]any {
	return execEntry(name, "/plugins/bin/credbroker-shim", "--provider", provider)
}

func execEntry(name, command string, args ...string) map[string]any {
	a := []any{}
	for _, s := range args {
		a = append(a, s)
	}
	return map[string]any{"name": name, "execConfig": map[string]any{
		"apiVersion": "client.authentication.k8s.io/v1", "command": command, "args": a,
		"provideClusterInfo": true, "interactiveMode": "Never",
	}}
}

// brokerConfig is deploy/'s broker config (the metrics component's), with providers replaced
// (by name) or added.
func brokerConfig(t *testing.T, providers ...string) map[string]any {
	t.Helper()
	cfg, err := harness.DeployBrokerConfig()
	if err != nil {
		t.Fatal(err)
	}
	list, _ := cfg["providers"].([]any)
	for _, text := range providers {
		p := map[string]any{}
		if err := yaml.Unmarshal([]byte(text), &p); err != nil {
			t.Fatalf("provider %q: %v", text, err)
		}
		replaced := false
		for i, old := range list {
			if m, _ := old.(map[string]any); m["name"] == p["name"] {
				list[i] = p
				replaced = true
			}
		}
		if !replaced {
			list = append(list, p)
		}
	}
	cfg["providers"] = list
	return cfg
}

// startExecBroker starts a broker alone (no Kueue) with deploy/'s config and the exec
// provider running the token plugin, its tokens and run log in run (mounted at /var/run/e2e);
// stopped when the test ends.
func startExecBroker(t *testing.T, dir, run string) *harness.Broker {
	t.Helper()
	b, err := harness.StartBroker(context.Background(), harness.BrokerOptions{
		Content: fw.Content, Config: brokerConfig(t, execProvider),
		SocketDir: filepath.Join(dir, "socket"), TokenDir: filepath.Join(dir, "tokens"), Dir: filepath.Join(dir, "broker"),
		Mounts: []harness.Mount{
			{Src: fw.TokenPlugin, Dst: "/opt/e2e/bin/tokenplugin"},
			{Src: run, Dst: "/var/run/e2e", RW: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(harness.QuickStopGrace) })
	return b
}

func startStack(t *testing.T, env *harness.Env, o harness.StackOptions) *harness.Stack {
	t.Helper()
	ctx := context.Background()
	dir := fw.Dir(strings.ReplaceAll(t.Name(), "/", "_"))
	s, err := env.StartStack(ctx, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if s.Broker != nil {
				t.Logf("broker log tail:\n%s", harness.Tail(s.Broker.LogText(), 40))
			}
			if s.Kueue != nil {
				t.Logf("hub kueue log tail:\n%s", harness.Tail(s.Kueue.LogText(), 25))
			}
		}
		s.Stop(ctx)
	})
	return s
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// noTokenIn fails if any issued token appears in text.
func noTokenIn(t *testing.T, what, text string, tokens ...string) {
	t.Helper()
	for _, tok := range tokens {
		if tok != "" && strings.Contains(text, tok) {
			t.Errorf("%s contains a token", what)
		}
	}
}
