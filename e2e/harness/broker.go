package harness

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// DeployBrokerConfig is the broker config the sidecar component ships
// (deploy/kueue/components/credbroker-sidecar/credbroker.yaml), parsed; StartBroker sets its
// metrics.address, as deploy/examples/metrics's config does.
func DeployBrokerConfig() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "deploy/kueue/components/credbroker-sidecar/credbroker.yaml"))
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{}
	return cfg, yaml.Unmarshal(b, &cfg)
}

// Broker is credbroker running as the sidecar runs: /bin/credbroker serve --config
// /etc/credbroker/config.yaml, uid 65532, in a root holding the image content and the pod's volumes.
type Broker struct {
	*Container
	SocketHost  string // the socket as the host sees it
	MetricsPort int
	content     string
}

// BrokerOptions: what one broker runs with.
type BrokerOptions struct {
	Content   string         // scripts/image-content.sh output
	Config    map[string]any // metrics.address is set here to a loopback port
	SocketDir string         // host dir shared with Kueue at /var/run/credbroker
	TokenDir  string         // host dir at /var/run/secrets/credbroker/clusters
	Dir       string
	Mounts    []Mount
	Env       []string
	// Identity, when set, is the pod's ServiceAccount as the kubelet projects it into every
	// container (the kubernetesSecret provider's in-cluster config).
	Identity *ServiceAccountVolume
}

// StartBroker starts the broker and waits until its health check passes.
func StartBroker(ctx context.Context, o BrokerOptions) (*Broker, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	o.Config["metrics"] = map[string]any{"address": fmt.Sprintf("127.0.0.1:%d", port)}
	cfgYAML, err := yaml.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	cfgDir := filepath.Join(o.Dir, "etc-credbroker")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "config.yaml"), cfgYAML, 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command(filepath.Join(o.Content, "bin/credbroker"), "check-config", filepath.Join(cfgDir, "config.yaml")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("credbroker check-config: %w\n%s", err, out)
	}
	for _, d := range []string{o.SocketDir, o.TokenDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Chown(o.SocketDir, 65532, 65532); err != nil {
		return nil, err
	}
	mounts := append([]Mount{
		{Src: filepath.Join(o.Content, "bin"), Dst: "/bin"},
		{Src: filepath.Join(o.Content, "plugins"), Dst: "/plugins"},
		{Src: filepath.Join(o.Content, "etc/ssl"), Dst: "/etc/ssl"},
		{Src: filepath.Join(o.Content, "etc/passwd"), Dst: "/etc/passwd"},
		{Src: filepath.Join(o.Content, "etc/group"), Dst: "/etc/group"},
		{Src: cfgDir, Dst: "/etc/credbroker"},
		{Src: o.SocketDir, Dst: "/var/run/credbroker", RW: true},
		{Src: o.TokenDir, Dst: "/var/run/secrets/credbroker/clusters"},
	}, o.Mounts...)
	env := o.Env
	if o.Identity != nil {
		mounts = append(mounts, o.Identity.Mount)
		env = append(append([]string{}, o.Identity.Env...), env...)
	}
	b := &Broker{
		SocketHost:  filepath.Join(o.SocketDir, "broker.sock"),
		MetricsPort: port,
		content:     o.Content,
		Container: &Container{
			Name:  "credbroker",
			Argv:  []string{"/bin/credbroker", "serve", "--config", "/etc/credbroker/config.yaml"},
			Env:   env,
			Mount: mounts,
			Dir:   filepath.Join(o.Dir, "container"),
			Log:   filepath.Join(o.Dir, "credbroker.log"),
		},
	}
	if err := b.Restart(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// Restart starts the (stopped) broker again with the same config and waits for health.
func (b *Broker) Restart(ctx context.Context) error {
	if err := b.Start(); err != nil {
		return err
	}
	err := Eventually(ctx, BrokerHealthTimeout, FastInterval, func() error {
		if !b.Running() {
			return StopTrying(fmt.Errorf("the broker exited"))
		}
		return exec.Command(filepath.Join(b.content, "bin/credbroker"), "health", "--socket", b.SocketHost, "--timeout", BrokerHealthCallTimeout.String()).Run()
	})
	if err != nil {
		_ = b.Stop(QuickStopGrace)
		return fmt.Errorf("broker not healthy: %w; log:\n%s", err, Tail(b.LogText(), 30))
	}
	return nil
}

// Metrics scrapes /metrics and sums each metric name{labels} line into a map keyed by the
// whole series text (name{labels}).
func (b *Broker) Metrics() (map[string]float64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", b.MetricsPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// Sum adds the series of metric name whose labels contain every given label="value".
func Sum(m map[string]float64, name string, labels ...string) float64 {
	total := 0.0
	for series, v := range m {
		n, rest, _ := strings.Cut(series, "{")
		if n != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(rest, l) {
				ok = false
			}
		}
		if ok {
			total += v
		}
	}
	return total
}

// Counts are the broker's figures the scenarios print. Reasks are the re-asks (a caller asking
// again before its come-back time) checked with the cluster's API server, one per check (a
// re-ask about a credential already replaced needs none); Rejected are the checks the API
// server answered 401 (confirmed rejections, what the alert fires on); Unchecked the re-asks
// taken as rejections without a check (no cluster info in the request).
type Counts struct {
	Requests, OK, Fetches, FetchErrors, Reasks, Rejected, Unchecked float64
}

// CountsFor reads the broker's counters for one provider.
func (b *Broker) CountsFor(provider string) (Counts, error) {
	m, err := b.Metrics()
	if err != nil {
		return Counts{}, err
	}
	p := fmt.Sprintf(`provider="%s"`, provider)
	return Counts{
		Requests:    Sum(m, "credbroker_requests_total", p),
		OK:          Sum(m, "credbroker_requests_total", p, `code="OK"`),
		Fetches:     Sum(m, "credbroker_upstream_fetch_duration_seconds_count", p),
		FetchErrors: Sum(m, "credbroker_upstream_fetch_duration_seconds_count", p, `outcome="error"`),
		Reasks:      Sum(m, "credbroker_reask_checks_total", p),
		Rejected:    Sum(m, "credbroker_reask_checks_total", p, `answer="rejected"`),
		Unchecked:   Sum(m, "credbroker_reask_checks_total", p, `answer="unchecked"`),
	}, nil
}
