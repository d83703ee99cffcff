package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Who is who in the suite, as in a user's clusters:
//
//   - the hub's Kueue manager and the broker (the one pod) reach the hub's API server with
//     the ServiceAccount kueue-system/kueue-controller-manager and the RBAC of Kueue's own
//     release manifests, through the files the kubelet projects into every pod;
//   - credbroker's credential on a worker is a token of the ServiceAccount that
//     deploy/examples/worker-rbac creates and binds there (docs/deploy.md, section 6), minted
//     with the TokenRequest API; the worker's API server checks it (signature, ServiceAccount
//     existence and UID), so deleting the ServiceAccount revokes every token of it.

// WorkerRBACDir is the worker RBAC users apply on each worker (docs/deploy.md, section 6).
func WorkerRBACDir() string { return filepath.Join(RepoRoot(), "deploy", "examples", "worker-rbac") }

// WorkerIdentity is the ServiceAccount deploy/examples/worker-rbac binds on a worker.
const (
	WorkerIdentityNamespace = "kueue-system"
	WorkerIdentityName      = "credbroker-multikueue"
)

// KueueServiceAccount is the ServiceAccount of Kueue's manager pod in its release manifests.
const (
	KueueNamespace      = "kueue-system"
	KueueServiceAccount = "kueue-controller-manager"
)

// tokenTTL is how long a minted ServiceAccount token lives: longer than the whole suite
// (kube-apiserver refuses less than 10 minutes), so only a revocation ends one.
const tokenTTL = 2 * time.Hour

// Kubectl runs kubectl against the cluster as its admin, with stdin; returns the combined output.
func (c *Cluster) Kubectl(stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: kubectl %s: %w\n%s", c.Name, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// ApplyWorkerRBAC applies deploy/examples/worker-rbac as its kustomization tells users to on
// each worker: `kubectl kustomize deploy/examples/worker-rbac | kubectl apply --server-side -f -`.
func (c *Cluster) ApplyWorkerRBAC() error {
	rendered, err := exec.Command("kubectl", "kustomize", WorkerRBACDir()).Output()
	if err != nil {
		return fmt.Errorf("kubectl kustomize deploy/examples/worker-rbac: %w", err)
	}
	_, err = c.Kubectl(rendered, "apply", "--server-side", "-f", "-")
	return err
}

// WorkerToken mints a token of the worker identity (TokenRequest), as docs/deploy.md's
// on-prem recipe does with `kubectl create token`.
func (c *Cluster) WorkerToken(ctx context.Context) (string, error) {
	return c.CreateToken(ctx, WorkerIdentityNamespace, WorkerIdentityName)
}

// RevokeWorkerIdentity does what an operator does after a leak: deletes the worker identity's
// ServiceAccount (every token of it is refused from then on, after kube-apiserver's 10 s
// authentication cache), waits until it is gone, and applies deploy/examples/worker-rbac
// again, which creates a new ServiceAccount (new UID) under the same binding.
func (c *Cluster) RevokeWorkerIdentity(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	sas := cs.CoreV1().ServiceAccounts(WorkerIdentityNamespace)
	if err := sas.Delete(ctx, WorkerIdentityName, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("%s: delete ServiceAccount %s: %w", c.Name, WorkerIdentityName, err)
	}
	if err := Eventually(ctx, ServiceAccountGoneTimeout, FastInterval, func() error {
		_, err := sas.Get(ctx, WorkerIdentityName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			return fmt.Errorf("still there")
		}
		return err
	}); err != nil {
		return fmt.Errorf("%s: ServiceAccount %s not deleted: %w", c.Name, WorkerIdentityName, err)
	}
	return c.ApplyWorkerRBAC()
}

// CreateToken mints a token of ServiceAccount ns/name with the TokenRequest API.
func (c *Cluster) CreateToken(ctx context.Context, ns, name string) (string, error) {
	return c.CreateTokenFor(ctx, ns, name)
}

// CreateTokenFor mints a token of ServiceAccount ns/name for audiences (none: the API
// server's own), as the kubelet mints a projected serviceAccountToken volume's.
func (c *Cluster) CreateTokenFor(ctx context.Context, ns, name string, audiences ...string) (string, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return "", err
	}
	secs := int64(tokenTTL.Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("%s: TokenRequest for %s/%s: %w", c.Name, ns, name, err)
	}
	return tr.Status.Token, nil
}

// ProjectedToken lays out, in dir/file, a projected serviceAccountToken volume of the hub
// pod's ServiceAccount (kueue-system/kueue-controller-manager) for audience: what a cloud's
// identity webhook (IRSA, Azure Workload ID) or a cross-cloud patch mounts into the broker's
// container. It returns the mount (dir at dst) and the token.
func (c *Cluster) ProjectedToken(ctx context.Context, dir, file, dst, audience string) (Mount, string, error) {
	tok, err := c.CreateTokenFor(ctx, KueueNamespace, KueueServiceAccount, audience)
	if err != nil {
		return Mount{}, "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Mount{}, "", err
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(tok), 0o644); err != nil {
		return Mount{}, "", err
	}
	return Mount{Src: dir, Dst: dst}, tok, nil
}

// ServiceAccountVolume is what the kubelet gives every container of a pod for its
// ServiceAccount: the projected volume at /var/run/secrets/kubernetes.io/serviceaccount
// (token, ca.crt, namespace) and the KUBERNETES_SERVICE_HOST/PORT environment, pointing here
// at the API server's loopback address instead of the kubernetes Service.
type ServiceAccountVolume struct {
	Mount Mount
	Env   []string
}

// ServiceAccountVolume mints a token of ns/name and lays the projected volume out in dir.
func (c *Cluster) ServiceAccountVolume(ctx context.Context, dir, ns, name string) (*ServiceAccountVolume, error) {
	tok, err := c.CreateToken(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for f, data := range map[string][]byte{"token": []byte(tok), "ca.crt": c.CAData, "namespace": []byte(ns)} {
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			return nil, err
		}
	}
	host, port, ok := strings.Cut(strings.TrimPrefix(c.Server, "https://"), ":")
	if !ok {
		return nil, fmt.Errorf("%s: no port in %s", c.Name, c.Server)
	}
	return &ServiceAccountVolume{
		Mount: Mount{Src: dir, Dst: "/var/run/secrets/kubernetes.io/serviceaccount"},
		Env:   []string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port},
	}, nil
}

// rbacKinds are the objects of a rendered Kueue installation that say who Kueue's manager is
// and what it may do.
var rbacKinds = map[string]bool{
	"ServiceAccount": true, "Role": true, "ClusterRole": true, "RoleBinding": true, "ClusterRoleBinding": true,
}

// InstallKueueRBAC applies, with kubectl, the ServiceAccount, Roles, ClusterRoles and their
// bindings of a rendered Kueue installation (Kueue's release manifests, or an overlay of
// them): the identity and permissions Kueue's manager pod runs with. The rest (Deployment,
// Services, webhook configurations) needs a node and is replaced by the suite's processes.
func (c *Cluster) InstallKueueRBAC(rendered []byte) error {
	var docs [][]byte
	for _, doc := range bytes.Split(rendered, []byte("\n---\n")) {
		var obj struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &obj); err == nil && rbacKinds[obj.Kind] {
			docs = append(docs, doc)
		}
	}
	if len(docs) == 0 {
		return fmt.Errorf("%s: the rendered Kueue installation has no RBAC objects", c.Name)
	}
	_, err := c.Kubectl(bytes.Join(docs, []byte("\n---\n")), "apply", "--server-side", "-f", "-")
	return err
}

// AuthFailures is how many requests the API server could not authenticate so far
// (kube-apiserver's authentication_attempts{result="failure"|"error"}): a revoked token's
// 401s.
func (c *Cluster) AuthFailures(ctx context.Context) (float64, error) {
	return c.metricSum(ctx, "authentication_attempts{", `result="failure"`, `result="error"`)
}

// AuthConfigReloads is how many times the API server reloaded its --authentication-config
// file successfully (apiserver_authentication_config_controller_automatic_reloads_total).
func (c *Cluster) AuthConfigReloads(ctx context.Context) (float64, error) {
	return c.metricSum(ctx, "apiserver_authentication_config_controller_automatic_reloads_total{", `status="success"`)
}

// metricSum sums the API server's /metrics series starting with prefix whose labels hold any
// of anyOf.
func (c *Cluster) metricSum(ctx context.Context, prefix string, anyOf ...string) (float64, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return 0, err
	}
	raw, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: GET /metrics: %w", c.Name, err)
	}
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		match := false
		for _, l := range anyOf {
			match = match || strings.Contains(line, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			total += v
		}
	}
	return total, sc.Err()
}
