package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"credbroker.dev/e2e/harness"
)

const kueueOld = "v0.17.0"

// TestOlderKueueCredentialsProviders: Kueue v0.17.0, whose configuration names the list
// credentialsProviders (docs/deploy.md: "Kueue v0.15–v0.18: credentialsProviders (same
// entries)") and whose ClusterProfile library reads status.credentialProviders. Its own fleet:
// a hub and a worker with v0.17.0's CRDs, webhooks and ClusterProfile CRD.
func TestOlderKueueCredentialsProviders(t *testing.T) {
	ctx := context.Background()
	peer, ok := peers.Kueue[kueueOld]
	if !ok {
		t.Fatalf("kueue %s is not among the peers (e2e/peers.sh builds it)", kueueOld)
	}
	env, err := harness.StartEnv(ctx, filepath.Join(scratch, "fleet-"+kueueOld), peers, peer, 1, content, plugin, auth, "k17-")
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	cfg := kueueConfig(t)
	cp := harness.Sub(harness.Sub(cfg, "multiKueue"), "clusterProfile")
	cp["credentialsProviders"] = cp["accessProviders"]
	delete(cp, "accessProviders")
	s, err := env.StartStack(ctx, filepath.Join(scratch, t.Name()), harness.StackOptions{BrokerConfig: brokerConfig(t), KueueConfig: cfg})
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
		writeFile(t, filepath.Join(s.TokenDir, name), auth.Issue(c.Name)+"\n")
		w, err := s.NewWorker(name, "onprem", c, map[string]any{"clusterName": name})
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	dispatch(t, s, "old", "credentialProviders", workers)
	c, _ := s.Broker.CountsFor("onprem")
	t.Logf("Kueue %s: broker onprem %v GetToken calls, %v upstream fetches, %v re-asks (%v confirmed rejections)", kueueOld, c.Requests, c.Fetches, c.Reasks, c.Rejected)
}
