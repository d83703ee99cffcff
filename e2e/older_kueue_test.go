package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"credbroker.dev/e2e/harness"
)

const kueueOld = "v0.17.0"

// TestOlderKueueCredentialsProviders: Kueue v0.17.0 with what docs/deploy.md tells users of
// Kueue v0.15–v0.18 to apply: section 3's kustomization with
// components/kueue-config-credentials-providers (the list named credentialsProviders), rendered
// over v0.17.0's own release manifests and run unmodified but for the host-process changes.
// Its ClusterProfile library reads status.credentialProviders. Its own fleet: a hub and a
// worker with v0.17.0's CRDs, webhooks, RBAC and ClusterProfile CRD.
//
// First, the defect that component fixes: v0.17.0 decodes its configuration strictly, so
// the shipped components/kueue-config (v0.19's accessProviders) stops it at start.
func TestOlderKueueCredentialsProviders(t *testing.T) {
	ctx := context.Background()
	env, err := fw.StartEnv(ctx, harness.EnvOptions{
		Kueue: kueueOld, Workers: 1, Prefix: "k17-", Overlay: harness.CredentialsProvidersOverlay,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()

	shipped, err := harness.RenderDeploy(env.Kueue, fw.Scratch, harness.ShippedOverlay)
	if err != nil {
		t.Fatal(err)
	}
	v19cfg, err := harness.KueueConfigOf(shipped)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := env.StartStack(ctx, fw.Dir(t.Name()+"-v0.19-config"), harness.StackOptions{KueueConfig: v19cfg})
	if err == nil {
		bad.Stop(ctx)
		t.Fatalf("Kueue %s started with components/kueue-config (accessProviders); want it refused", kueueOld)
	}
	if !strings.Contains(err.Error(), "accessProviders") {
		t.Fatalf("Kueue %s with components/kueue-config failed, but not naming accessProviders: %v", kueueOld, err)
	}
	t.Logf("Kueue %s with components/kueue-config (v0.19's accessProviders) exits at start: %s", kueueOld, firstLineWith(err.Error(), "accessProviders"))

	s, err := env.StartStack(ctx, fw.Dir(t.Name()), harness.StackOptions{
		BrokerConfig: brokerConfig(t), KueueConfig: envKueueConfig(t, env, "credentialsProviders"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("hub kueue %s log tail:\n%s", kueueOld, harness.Tail(s.Kueue.LogText(), 25))
		}
		s.Stop(ctx)
	}()
	var workers []*harness.Worker
	for i, c := range env.Workers {
		name := fmt.Sprintf("old-%d", i+1)
		writeFile(t, filepath.Join(s.TokenDir, name), workerToken(t, c)+"\n")
		w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	expectDispatch(t, s, "old", "credentialProviders", workers)
	c, err := s.Broker.CountsFor("onprem")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Kueue %s: broker onprem %v GetToken calls, %v upstream fetches, %v re-asks (%v confirmed rejections)", kueueOld, c.Requests, c.Fetches, c.Reasks, c.Rejected)
	if c.Fetches != float64(len(workers)) {
		t.Errorf("upstream fetches = %v, want %d (one per cluster)", c.Fetches, len(workers))
	}
}

// firstLineWith is the first line of text containing sub, cut to 300 bytes.
func firstLineWith(text, sub string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			return strings.TrimSpace(l)
		}
	}
	return ""
}
