package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Framework is what the whole suite shares, one value started by TestMain and stopped after
// the last test (the shape of Kueue's test/integration/framework.Framework): the peers, the
// image content, the token plugin, the scratch directory and the fleet every scenario on the
// main Kueue runs on. Scenarios that need a fleet or a hub of their own start it from here
// (StartEnv, StartNodeHub), so that only their own options are theirs to give.
type Framework struct {
	opts FrameworkOptions
	// Peers are e2e/peers.sh's binaries and manifests (peers.env).
	Peers *Peers
	// Content is the image content (scripts/image-content.sh, or CREDBROKER_E2E_CONTENT).
	Content string
	// TokenPlugin is cmd/tokenplugin, built: the exec provider's upstream.
	TokenPlugin string
	// Scratch is the suite's scratch directory, made and removed by the parent process
	// (RunInSuiteNetwork).
	Scratch string
	// Fleet is the hub and workers on FrameworkOptions.Kueue that the scenarios share, and
	// FleetUpIn how long they took to start.
	Fleet     *Env
	FleetUpIn time.Duration
}

// FrameworkOptions: what the suite's shared fleet runs.
type FrameworkOptions struct {
	// Kueue is the version of the Kueue peer the fleet runs (e2e/peers.sh builds it).
	Kueue string
	// Workers is how many worker clusters the fleet has.
	Workers int
}

// NewFramework is a framework not started yet.
func NewFramework(o FrameworkOptions) *Framework { return &Framework{opts: o} }

// Start loads the peers, finds the scratch directory the parent process made, lays out the
// image content, builds the token plugin and starts the fleet. On error, what it started is
// stopped.
func (f *Framework) Start(ctx context.Context) error {
	var err error
	if f.Peers, err = LoadPeers(); err != nil {
		return err
	}
	if _, ok := f.Peers.Kueue[f.opts.Kueue]; !ok {
		return fmt.Errorf("kueue %s is not among the peers", f.opts.Kueue)
	}
	if f.Scratch = os.Getenv(ScratchEnv); f.Scratch == "" {
		return fmt.Errorf("%s is not set: run the suite with go test (TestMain starts it)", ScratchEnv)
	}
	if f.Content, err = ImageContent(); err != nil {
		return err
	}
	f.TokenPlugin = f.Dir("tokenplugin")
	if err := BuildGo("./cmd/tokenplugin", f.TokenPlugin); err != nil {
		return err
	}
	start := time.Now()
	f.Fleet, err = f.StartEnv(ctx, EnvOptions{Kueue: f.opts.Kueue, Workers: f.opts.Workers, Overlay: ShippedOverlay})
	f.FleetUpIn = time.Since(start)
	return err
}

// Stop stops the fleet. The scratch directory is the parent process's to remove.
func (f *Framework) Stop() {
	if f.Fleet != nil {
		f.Fleet.Stop()
	}
}

// Dir is the path of name in the scratch directory.
func (f *Framework) Dir(name string) string { return filepath.Join(f.Scratch, name) }

// StartEnv starts a fleet of its own (a hub and o.Workers workers on Kueue o.Kueue) in the
// scratch directory, with the framework's peers, image content and token plugin.
func (f *Framework) StartEnv(ctx context.Context, o EnvOptions) (*Env, error) {
	peer, ok := f.Peers.Kueue[o.Kueue]
	if !ok {
		return nil, fmt.Errorf("kueue %s is not among the peers (e2e/peers.sh builds it)", o.Kueue)
	}
	return startEnv(ctx, f, peer, o)
}

// StartNodeHub starts a hub whose Kueue runs as a pod on a node, on the framework's Kueue,
// in the scratch directory's "node".
func (f *Framework) StartNodeHub(ctx context.Context, o NodeHubOptions) (*NodeHub, error) {
	return startNodeHub(ctx, f.Dir("node"), f.Peers, f.Peers.Kueue[f.opts.Kueue], o)
}
