package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"github.com/onsi/gomega"
)

// The cloud providers through real Kueue, each verified by a worker API server the way its
// cloud's clusters verify tokens (e2e/README.md, "Cloud workers: what is real and what stands
// in"): the shipped broker config (deploy/'s eks, gke and aks entries) with only the
// endpoints pointed at the stand-ins (the environment each cloud's identity webhook injects),
// the shipped Kueue config, and on the worker exactly the RBAC docs/deploy.md tells users to
// bind for that cloud.

// fanOut is how many ClusterProfiles share one identity in each cloud scenario (issue 33:
// ten workers per cloud).
const fanOut = 10

// cloudIdentityBinding is docs/deploy.md's ClusterRoleBinding credbroker-multikueue-cloud
// with only the subject of cloud (the comment its line carries: EKS, GKE or AKS), its
// placeholder replaced by name; deploy/examples/worker-rbac (the ClusterRole) is on every
// worker already.
func cloudIdentityBinding(t *testing.T, cloud, placeholder, name string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml k8s\n(apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: \\{name: credbroker-multikueue-cloud\\}.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deploy.md has no ClusterRoleBinding credbroker-multikueue-cloud block")
	}
	var out []string
	found := false
	for _, line := range strings.Split(string(m[1]), "\n") {
		if strings.HasPrefix(line, "  - {") {
			if !strings.Contains(line, "# "+cloud) {
				continue
			}
			if !strings.Contains(line, placeholder) {
				t.Fatalf("docs/deploy.md's %s subject does not name %q: %s", cloud, placeholder, line)
			}
			line, found = strings.Replace(line, placeholder, name, 1), true
		}
		out = append(out, line)
	}
	if !found {
		t.Fatalf("docs/deploy.md's binding has no subject for %s", cloud)
	}
	return strings.Join(out, "\n")
}

// cloudWorker starts a worker of the suite's fleet whose kube-apiserver gets flags, binds
// binding there, and stops it when the test ends.
func cloudWorker(t *testing.T, name string, flags map[string]string, binding string) *harness.ExtraWorker {
	t.Helper()
	ctx := context.Background()
	w, err := fw.Fleet.StartWorker(ctx, name, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	if err := harness.Apply(ctx, w.Cluster.Client, binding); err != nil {
		t.Fatal(err)
	}
	return w
}

// cloudProfiles makes n ClusterProfile entries of access provider provider, all addressing c
// (each through its own relay: n addresses), named prefix-1..n with the extension ext(name).
func cloudProfiles(t *testing.T, s *harness.Stack, prefix, provider string, c *harness.Cluster, n int, ext func(string) map[string]any) []*harness.Worker {
	t.Helper()
	var workers []*harness.Worker
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		w, err := s.NewWorker(name, provider, c, ext(name))
		if err != nil {
			t.Fatal(err)
		}
		workers = append(workers, w)
	}
	return workers
}

func clusterNameExt(name string) map[string]any { return map[string]any{"clusterName": name} }

func names(workers []*harness.Worker) []string {
	var out []string
	for _, w := range workers {
		out = append(out, w.Name)
	}
	return out
}

// brokerCounts reads the broker's counters for provider or ends the test.
func brokerCounts(t *testing.T, s *harness.Stack, provider string) harness.Counts {
	t.Helper()
	c, err := s.Broker.CountsFor(provider)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// expectFakeClean asserts a stand-in refused nothing as malformed: what the broker sent is
// what the cloud accepts.
func expectFakeClean(t *testing.T, what string, violations []string) {
	t.Helper()
	if len(violations) > 0 {
		t.Errorf("%s refused malformed requests: %q", what, violations)
	}
}

// recovery is what expectRevocationRecovers prints and checks.
type recovery struct {
	seconds                                float64
	fetches, fetchErrors, rejected, reasks float64
	authFailures                           float64
	cut                                    int
}

// expectRevocationRecovers revokes the identity as an operator does (revoke), waits out
// kube-apiserver's 10 s cache of a successful authentication and cuts every connection:
// Kueue's next requests get the worker's 401, the broker's check of the re-ask gets it too (a
// confirmed rejection) and fetches anew. Once one is confirmed the identity is made valid
// again (restore): every cluster turns Active again and a Job submitted then is admitted.
// The seconds are from the restore to that.
func expectRevocationRecovers(t *testing.T, s *harness.Stack, provider string, c *harness.Cluster, workers []*harness.Worker, set string, revoke, restore func()) recovery {
	t.Helper()
	ctx := context.Background()
	c0 := brokerCounts(t, s, provider)
	failed0, err := c.AuthFailures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := s.Kueue.Pid()
	revoke()
	time.Sleep(harness.TokenCacheWait)
	var r recovery
	for _, w := range workers {
		r.cut += w.Forward.Cut()
	}
	expectAuthFailures(t, c, failed0, harness.Timeout, fmt.Sprintf("Kueue never presented the revoked credential (cut %d connections)", r.cut))
	gomega.NewWithT(t).Eventually(func() error {
		if got := brokerCounts(t, s, provider); got.Rejected <= c0.Rejected {
			return fmt.Errorf("%v confirmed rejections, %v re-asks since the revocation", got.Rejected-c0.Rejected, got.Reasks-c0.Reasks)
		}
		return nil
	}).WithTimeout(harness.Timeout).WithPolling(harness.FastInterval).Should(gomega.Succeed(), "the broker never had the worker's 401 confirmed")
	restored := time.Now()
	restore()
	job := set + "-after-revocation"
	if err := s.SubmitJob(ctx, set, job); err != nil {
		t.Fatal(err)
	}
	expectClustersActive(t, s, harness.RecoveryTimeout, names(workers)...)
	a, nudged := expectJobAdmittedNudging(t, s, set, job, harness.NudgeAfter, nil)
	r.seconds = time.Since(restored).Seconds()
	c1 := brokerCounts(t, s, provider)
	failed1, _ := c.AuthFailures(ctx)
	r.fetches, r.fetchErrors = c1.Fetches-c0.Fetches, c1.FetchErrors-c0.FetchErrors
	r.rejected, r.reasks, r.authFailures = c1.Rejected-c0.Rejected, c1.Reasks-c0.Reasks, failed1-failed0
	t.Logf("revoked, cut %d connections: %v requests the worker refused; %v re-asks, %v confirmed rejections; restored: all %d clusters Active and Job %s admitted on %s %.2fs later (nudged: %v); %v upstream fetches meanwhile (%v failed)",
		r.cut, r.authFailures, r.reasks, r.rejected, len(workers), job, a.ClusterName, r.seconds, nudged, r.fetches, r.fetchErrors)
	if s.Kueue.Pid() != pid || !s.Kueue.Running() {
		t.Errorf("Kueue was restarted")
	}
	if r.rejected < 1 || c1.Unchecked != c0.Unchecked {
		t.Errorf("confirmed rejections = %v (unchecked %v), want at least 1 and none unchecked", r.rejected, c1.Unchecked-c0.Unchecked)
	}
	return r
}

// TestCloudAzure: the aks provider (workload identity) through real Kueue to an AKS-like
// worker, whose kube-apiserver verifies the Entra token itself (--authentication-config: a
// JWT authenticator trusting the fake Entra's issuer, audience the AKS server application).
func TestCloudAzure(t *testing.T) {
	ctx := context.Background()
	dir := fw.Dir(t.Name())
	const (
		tenant   = "72f988bf-86f1-41af-91ab-2d7cd011db47"
		clientID = "11111111-2222-3333-4444-555555555555"
		objectID = "0b6c8a9e-4f1d-4c3b-9a7e-2d5f8e1c6b3a"
	)
	entra, err := harness.StartFakeEntra(ctx, filepath.Join(dir, "entra"), fw.Fleet.Hub, tenant, clientID, objectID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(entra.Close)
	authn := filepath.Join(dir, "authentication-config.yaml")
	if err := entra.WriteAuthenticationConfig(authn, false); err != nil {
		t.Fatal(err)
	}
	worker := cloudWorker(t, "aks-worker", map[string]string{"authentication-config": authn},
		cloudIdentityBinding(t, "AKS", "00000000-0000-0000-0000-000000000000", objectID))

	// What the azure-workload-identity webhook gives the pod's containers
	// (deploy/examples/identity/azure-workload-identity): the projected token and the
	// AZURE_* environment; the authority host is the fake's.
	tokMount, fedToken, err := fw.Fleet.Hub.ProjectedToken(ctx, filepath.Join(dir, "azure-token"), "azure-identity-token", "/var/run/secrets/azure/tokens", harness.AzureExchangeAudience)
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, fw.Fleet, harness.StackOptions{
		BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t),
		BrokerEnv: []string{
			"AZURE_CLIENT_ID=" + clientID, "AZURE_TENANT_ID=" + tenant,
			"AZURE_FEDERATED_TOKEN_FILE=/var/run/secrets/azure/tokens/azure-identity-token",
			"AZURE_AUTHORITY_HOST=" + entra.URL, "SSL_CERT_FILE=" + harness.FakeCAFile,
		},
		BrokerMounts: []harness.Mount{tokMount, {Src: entra.CADir, Dst: harness.FakeCAMount}},
	})
	workers := cloudProfiles(t, s, "aks", "aks", worker.Cluster, fanOut, clusterNameExt)
	expectDispatchVia(t, s, "aks", "accessProviders", workers, workers[:1])
	c := brokerCounts(t, s, "aks")
	issued, _ := entra.TokenRequests()
	t.Logf("aks: %d ClusterProfiles on one identity: %d Entra token requests, %v upstream fetches, %v GetToken calls (%v OK)", fanOut, issued, c.Fetches, c.Requests, c.OK)
	if issued != 1 || c.Fetches != 1 {
		t.Errorf("Entra token requests = %d, upstream fetches = %v; want 1 each (one identity)", issued, c.Fetches)
	}

	// Revocation: the operator disables the application in Entra (no new token) and, since
	// an Entra token stays valid until it expires, refuses the identity on the worker (a
	// claim rule in its authentication configuration, which kube-apiserver reloads).
	setRefused := func(refused bool) {
		t.Helper()
		n0, err := worker.Cluster.AuthConfigReloads(ctx)
		if err != nil {
			t.Fatal(err)
		}
		entra.SetEnabled(!refused)
		if err := entra.WriteAuthenticationConfig(authn, refused); err != nil {
			t.Fatal(err)
		}
		gomega.NewWithT(t).Eventually(func() error {
			n, err := worker.Cluster.AuthConfigReloads(ctx)
			if err == nil && n <= n0 {
				err = fmt.Errorf("%v reloads of the authentication configuration", n)
			}
			return err
		}).WithTimeout(harness.AuthConfigReloadTimeout).WithPolling(harness.FastInterval).Should(gomega.Succeed())
	}
	r := expectRevocationRecovers(t, s, "aks", worker.Cluster, workers, "aks", func() { setRefused(true) }, func() { setRefused(false) })
	issued1, refused := entra.TokenRequests()
	t.Logf("aks revocation: recovered %.2fs after the identity was valid again; %v upstream fetches (%v failed); Entra: %d tokens issued, %d requests refused (disabled); %v confirmed rejections",
		r.seconds, r.fetches, r.fetchErrors, issued1-issued, refused, r.rejected)
	if issued1-issued < 1 {
		t.Errorf("no new Entra token after the revocation")
	}
	// The broker asks for a denied identity at most once per 5 s, not once per cluster that
	// shares it (each of the ten clusters' callers used to make one refused request).
	if refused >= fanOut {
		t.Errorf("Entra refused %d requests for %d clusters on one identity: asked once per cluster", refused, fanOut)
	}
	expectFakeClean(t, "the fake Entra ID", entra.Violations())
	noTokenIn(t, "the broker log", s.Broker.LogText(), fedToken, entra.TokenPrefix())
}

// gcpProject and gcpAccount: the Google service account the pod's ServiceAccount is tied to
// (deploy/examples/identity/gke-workload-identity), whose email GKE names as the user.
const (
	gcpProject = "e2e-project"
	gcpAccount = "kueue-credbroker@" + gcpProject + ".iam.gserviceaccount.com"
	// gcpAudience is the workload identity pool provider of docs/cross-cloud.md's recipe 1.
	gcpAudience = "//iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/kueue-pool/providers/eks-cluster"
)

// crossCloudProvider is docs/cross-cloud.md's broker provider for recipe 1 (Kueue outside
// GCP → GKE, an external_account credential configuration with impersonation).
const crossCloudProvider = `
name: gke
type: gcp
gcp:
  credentialsFile: /var/run/secrets/credbroker/gcp/credential-configuration.json
`

// TestCloudGCP: the gke provider through real Kueue to a GKE-like worker, whose
// kube-apiserver asks a token webhook that checks the access token at Google's tokeninfo
// (the fake's) and maps it to the service account's email: first with GKE Workload Identity
// (the metadata server), then with docs/cross-cloud.md's external_account configuration
// (STS and IAM Credentials), the cross-cloud recipe end to end.
func TestCloudGCP(t *testing.T) {
	ctx := context.Background()
	dir := fw.Dir(t.Name())
	google, err := harness.StartFakeGoogle(ctx, filepath.Join(dir, "google"), fw.Fleet.Hub, gcpAccount, gcpAudience)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(google.Close)
	webhook := filepath.Join(dir, "gke-webhook.kubeconfig")
	if err := google.WebhookKubeconfig(webhook, "/gke/authenticate"); err != nil {
		t.Fatal(err)
	}
	worker := cloudWorker(t, "gke-worker", harness.WebhookFlags(webhook),
		cloudIdentityBinding(t, "GKE", "kueue-credbroker@PROJECT.iam.gserviceaccount.com", gcpAccount))

	t.Run("workload-identity", func(t *testing.T) {
		// GKE Workload Identity: the broker finds the metadata server (GCE_METADATA_HOST,
		// plain HTTP as on a node) and no credential file.
		s := startStack(t, fw.Fleet, harness.StackOptions{
			BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t),
			BrokerEnv: []string{"GCE_METADATA_HOST=" + google.Metadata},
		})
		workers := cloudProfiles(t, s, "gke", "google", worker.Cluster, fanOut, clusterNameExt)
		expectDispatchVia(t, s, "gke", "accessProviders", workers, workers[:1])
		c := brokerCounts(t, s, "gke")
		g := google.Counts()
		t.Logf("gke: %d ClusterProfiles on one identity: %d metadata-server tokens, %v upstream fetches, %v GetToken calls (%v OK); the worker's webhook accepted %d and refused %d TokenReviews",
			fanOut, g.Metadata, c.Fetches, c.Requests, c.OK, g.Accepted, g.Rejected)
		if g.Metadata != 1 || c.Fetches != 1 {
			t.Errorf("metadata tokens = %d, upstream fetches = %v; want 1 each (one identity)", g.Metadata, c.Fetches)
		}
		// Revocation: the operator disables the Google service account: its tokens fail at
		// tokeninfo, and no new one is minted until it is enabled again.
		r := expectRevocationRecovers(t, s, "gke", worker.Cluster, workers, "gke", func() { google.SetEnabled(false) }, func() { google.SetEnabled(true) })
		g1 := google.Counts()
		t.Logf("gke revocation: recovered %.2fs after the account was enabled again; %v upstream fetches (%v failed); metadata: %d tokens minted, %d refused (disabled); %v confirmed rejections",
			r.seconds, r.fetches, r.fetchErrors, g1.Metadata-g.Metadata, g1.Refused-g.Refused, r.rejected)
		if g1.Metadata-g.Metadata < 1 {
			t.Errorf("no new metadata-server token after the revocation")
		}
		noTokenIn(t, "the broker log", s.Broker.LogText(), harness.GoogleTokenPrefix)
		// This stack's ClusterProfiles go before the next one's Kueue starts.
		s.Stop(ctx)
	})

	t.Run("external-account", func(t *testing.T) {
		// docs/cross-cloud.md, recipe 1: the projected token for the pool provider and the
		// credential configuration gcloud writes, its token_url and
		// service_account_impersonation_url at the fakes.
		tokMount, subject, err := fw.Fleet.Hub.ProjectedToken(ctx, filepath.Join(dir, "gcp-token"), "token", "/var/run/secrets/tokens/gcp", gcpAudience)
		if err != nil {
			t.Fatal(err)
		}
		cfgDir := filepath.Join(dir, "gcp-credential-configuration")
		writeFile(t, filepath.Join(cfgDir, "credential-configuration.json"), fmt.Sprintf(`{
  "universe_domain": "googleapis.com",
  "type": "external_account",
  "audience": %q,
  "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
  "token_url": "%s/v1/token",
  "service_account_impersonation_url": "%s/v1/projects/-/serviceAccounts/%s:generateAccessToken",
  "credential_source": {"file": "/var/run/secrets/tokens/gcp/token", "format": {"type": "text"}}
}
`, gcpAudience, google.URL, google.URL, gcpAccount))
		g0 := google.Counts()
		s := startStack(t, fw.Fleet, harness.StackOptions{
			BrokerConfig: brokerConfig(t, crossCloudProvider), KueueConfig: kueueConfig(t),
			// google-cloud-auth's own calls (STS, impersonation) take SSL_CERT_FILE instead
			// of the system roots (docs/providers/gcp.md, "TLS and proxies").
			BrokerEnv: []string{"SSL_CERT_FILE=" + harness.FakeCAFile},
			BrokerMounts: []harness.Mount{tokMount, {Src: cfgDir, Dst: "/var/run/secrets/credbroker/gcp"},
				{Src: google.CADir, Dst: harness.FakeCAMount}},
		})
		workers := cloudProfiles(t, s, "gkefed", "google", worker.Cluster, 2, clusterNameExt)
		expectDispatchVia(t, s, "gkefed", "accessProviders", workers, workers[:1])
		c := brokerCounts(t, s, "gke")
		g := google.Counts()
		t.Logf("gke external_account: %d ClusterProfiles: %d STS exchanges, %d impersonations, %d metadata-server tokens, %v upstream fetches",
			len(workers), g.STS-g0.STS, g.Impersonations-g0.Impersonations, g.Metadata-g0.Metadata, c.Fetches)
		if g.STS-g0.STS != 1 || g.Impersonations-g0.Impersonations != 1 || g.Metadata != g0.Metadata || c.Fetches != 1 {
			t.Errorf("want 1 STS exchange, 1 impersonation, no metadata-server token and 1 upstream fetch")
		}
		noTokenIn(t, "the broker log", s.Broker.LogText(), subject, harness.GoogleTokenPrefix)
	})
	expectFakeClean(t, "the fake Google", google.Violations())
}

// AWS: the role the pod's ServiceAccount assumes with IRSA (deploy/examples/identity/aws-irsa),
// in moto's default account.
const (
	awsRegion = "us-west-2"
	awsRole   = "arn:aws:iam::123456789012:role/kueue-credbroker"
	// awsGroup is docs/deploy.md's access entry group.
	awsGroup = "kueue-multikueue"
)

// TestCloudAWS: the eks provider (IRSA) through real Kueue to an EKS-like worker, whose
// kube-apiserver asks a token webhook doing what aws-iam-authenticator's server does
// (harness.EKSWebhook) against moto's STS, with the access entry docs/deploy.md tells users
// to create.
func TestCloudAWS(t *testing.T) {
	ctx := context.Background()
	dir := fw.Dir(t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	moto, err := harness.StartMoto(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(moto.Stop)
	fc, err := harness.StartFakeCloud(filepath.Join(dir, "eks"), "eks-webhook")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fc.Close)
	var clusterNames []string
	for i := 1; i <= fanOut; i++ {
		clusterNames = append(clusterNames, fmt.Sprintf("eks-%d", i))
	}
	eks := harness.NewEKSWebhook(fc, moto, awsRegion, clusterNames)
	eks.SetAccessEntry(awsRole, []string{awsGroup})
	webhook := filepath.Join(dir, "eks-webhook.kubeconfig")
	if err := fc.WebhookKubeconfig(webhook, "/eks/authenticate"); err != nil {
		t.Fatal(err)
	}
	worker := cloudWorker(t, "eks-worker", harness.WebhookFlags(webhook), cloudIdentityBinding(t, "EKS", awsGroup, awsGroup))

	// What EKS's pod identity webhook gives the pod's containers for IRSA: the projected
	// token for sts.amazonaws.com and the AWS_* environment; STS's endpoint is moto's.
	tokMount, webToken, err := fw.Fleet.Hub.ProjectedToken(ctx, filepath.Join(dir, "aws-token"), "token", "/var/run/secrets/eks.amazonaws.com/serviceaccount", "sts.amazonaws.com")
	if err != nil {
		t.Fatal(err)
	}
	s := startStack(t, fw.Fleet, harness.StackOptions{
		BrokerConfig: brokerConfig(t), KueueConfig: kueueConfig(t),
		BrokerEnv: []string{
			"AWS_ROLE_ARN=" + awsRole, "AWS_WEB_IDENTITY_TOKEN_FILE=/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
			"AWS_REGION=" + awsRegion, "AWS_DEFAULT_REGION=" + awsRegion, "AWS_STS_REGIONAL_ENDPOINTS=regional",
			"AWS_ENDPOINT_URL_STS=" + moto.URL,
		},
		BrokerMounts: []harness.Mount{tokMount},
	})
	workers := cloudProfiles(t, s, "eks", "eks", worker.Cluster, fanOut, func(name string) map[string]any {
		return map[string]any{"clusterName": name, "region": awsRegion}
	})
	expectDispatchVia(t, s, "eks", "accessProviders", workers, workers[:1])
	c := brokerCounts(t, s, "eks")
	sessions, err := moto.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	accepted, rejected, _ := eks.Counts()
	seen := eks.ClustersSeen()
	t.Logf("eks: %d ClusterProfiles on one identity: %d STS sessions (AssumeRoleWithWebIdentity), %v tokens signed (one per cluster name), %v GetToken calls (%v OK); the webhook accepted %d and refused %d TokenReviews, tokens signed for %d cluster names",
		fanOut, sessions, c.Fetches, c.Requests, c.OK, accepted, rejected, len(seen))
	if sessions != 1 {
		t.Errorf("STS sessions = %d, want 1 (one identity)", sessions)
	}
	if len(seen) != fanOut {
		t.Errorf("tokens were signed for %v, want each of the %d cluster names", seen, fanOut)
	}
	// Revocation: the operator deletes the role's access entry on the worker (the webhook
	// refuses its tokens: "ARN is not mapped") and creates it again.
	r := expectRevocationRecovers(t, s, "eks", worker.Cluster, workers, "eks",
		func() { eks.SetAccessEntry(awsRole, nil) }, func() { eks.SetAccessEntry(awsRole, []string{awsGroup}) })
	sessions1, _ := moto.Sessions()
	_, _, unmapped := eks.Counts()
	t.Logf("eks revocation: recovered %.2fs after the access entry was back; %v tokens signed (%v failed), %d new STS sessions; the webhook refused %d unmapped tokens; %v confirmed rejections",
		r.seconds, r.fetches, r.fetchErrors, sessions1-sessions, unmapped, r.rejected)
	if unmapped < 1 {
		t.Errorf("the webhook never refused an unmapped token")
	}
	noTokenIn(t, "the broker log", s.Broker.LogText(), webToken, harness.EKSTokenPrefix)
}
