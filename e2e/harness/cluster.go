package harness

import (
	"context"
	"encoding/base64"
	"fmt"
	"github.com/go-logr/logr"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// envtest logs through controller-runtime's logger, which warns with a stack trace when no
// logger is set; the suite reads the control planes' state, not that log.
func init() { ctrllog.SetLogger(logr.Discard()) }

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// Cluster is one real control plane: etcd and kube-apiserver (envtest starts them from the
// peers' binaries), the API server on NodeIP (the node's pods reach it; its certificate also
// names localhost and 127.0.0.1), its own CA and serving certificate, Kueue's CRDs (and the
// ClusterProfile CRD on a hub), and Kueue's webhooks pointed at a loopback port where the
// cluster's Kueue will listen. A node hub (ClusterOptions.Node) instead gets Kueue's CRDs and
// webhooks from Kueue's own manifests, applied by the scenario, and is set up for a kubelet.
type Cluster struct {
	Name       string
	Env        *envtest.Environment
	Config     *rest.Config // admin (system:masters client certificate)
	Client     client.Client
	Server     string // https://127.0.0.1:PORT
	CAData     []byte // PEM of the API server's CA
	Kubeconfig string // admin kubeconfig file, readable by the processes under test
	// WebhookPort and WebhookCertDir: where this cluster's Kueue serves its webhooks.
	WebhookPort    int
	WebhookCertDir string
}

// ClusterOptions say what a control plane carries.
type ClusterOptions struct {
	Name  string
	Peers *Peers
	Kueue KueuePeer // whose CRDs and webhooks to install (and whose ClusterProfile CRD on a hub)
	Hub   bool      // also the ClusterProfile CRD
	// Node: the hub a node joins (StartNode). Kueue runs in a pod there, installed from its
	// release manifests, so no CRD or webhook of Kueue's is installed here; the API server
	// runs the admission and authorization a cluster has (ServiceAccount admission, which
	// envtest turns off; the Node authorizer for the kubelet) and reaches webhooks and
	// aggregated APIs at their Service's endpoints (--enable-aggregator-routing), as no
	// kube-proxy runs beside it.
	Node bool
	Dir  string // scratch directory (kubeconfigs, webhook config)
	// APIServerFlags are set on kube-apiserver besides envtest's: how a cloud-like worker
	// authenticates its callers (--authentication-config, --authentication-token-webhook-*).
	APIServerFlags map[string]string
}

// StartCluster starts a control plane and waits until it serves.
func StartCluster(ctx context.Context, o ClusterOptions) (*Cluster, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	whPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	crds := []string{filepath.Join(o.Kueue.Dir, "config/components/crd/bases")}
	if o.Hub {
		crds = append(crds, o.Kueue.ClusterProfileCRDDir)
	}
	webhooks := envtest.WebhookInstallOptions{
		Paths:                    []string{filepath.Join(o.Kueue.Dir, "config/components/webhook/manifests.yaml")},
		LocalServingHost:         "127.0.0.1",
		LocalServingPort:         whPort,
		IgnoreErrorIfPathMissing: false,
	}
	if o.Node {
		crds = []string{o.Kueue.ClusterProfileCRDDir}
		webhooks = envtest.WebhookInstallOptions{}
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:        crds,
		ErrorIfCRDPathMissing:    true,
		ControlPlaneStartTimeout: ControlPlaneStartTimeout,
		ControlPlaneStopTimeout:  ControlPlaneStopTimeout,
		WebhookInstallOptions:    webhooks,
	}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: o.Peers.Etcd}
	api := &envtest.APIServer{Path: o.Peers.KubeAPIServer}
	// envtest picks 127.0.0.1 and a port unless given both.
	apiPort, err := freePortOn(NodeIP)
	if err != nil {
		return nil, err
	}
	api.SecureServing.Address, api.SecureServing.Port = NodeIP, strconv.Itoa(apiPort)
	// The serving certificate names the `kubernetes` Service's address too, as a cluster's
	// does (pods reach the API server there, through kube-proxy); envtest's names only the
	// listening address, so the certificates are made here, where envtest looks for them.
	api.CertDir = filepath.Join(o.Dir, "apiserver-certs")
	if api.SecureServing.CA, err = writeAPIServerCerts(api.CertDir); err != nil {
		return nil, err
	}
	// The address of the `kubernetes` Service's endpoint; the suite's network has no default
	// route, from which kube-apiserver would otherwise pick one.
	api.Configure().Set("advertise-address", NodeIP)
	if o.Node {
		api.Configure().
			Set("authorization-mode", "Node,RBAC").
			Set("enable-admission-plugins", "NodeRestriction").
			Disable("disable-admission-plugins").
			Set("enable-aggregator-routing", "true")
	}
	for k, v := range o.APIServerFlags {
		api.Configure().Set(k, v)
	}
	env.ControlPlane.APIServer = api
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("%s: control plane: %w", o.Name, err)
	}
	c := &Cluster{Name: o.Name, Env: env, Config: cfg, WebhookPort: whPort, WebhookCertDir: env.WebhookInstallOptions.LocalServingCertDir}
	c.Server = api.SecureServing.URL("https", "").String()
	c.CAData = api.SecureServing.CA
	// The webhook certificates are read by Kueue running as 65532.
	if !o.Node {
		if err := chmodTree(c.WebhookCertDir); err != nil {
			_ = c.Stop()
			return nil, err
		}
	}
	user, err := env.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	// The context's namespace is Kueue's, as a pod's ServiceAccount namespace would be (the
	// secretreader plugin reads its Secrets from there).
	if parsed, err := clientcmd.Load(kc); err == nil {
		if ctxt := parsed.Contexts[parsed.CurrentContext]; ctxt != nil {
			ctxt.Namespace = "kueue-system"
		}
		if out, err := clientcmd.Write(*parsed); err == nil {
			kc = out
		}
	}
	c.Kubeconfig = filepath.Join(o.Dir, "admin.kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o644); err != nil {
		_ = c.Stop()
		return nil, err
	}
	c.Client, err = client.New(cfg, client.Options{})
	if err != nil {
		_ = c.Stop()
		return nil, err
	}
	for _, ns := range []string{"kueue-system"} {
		if err := EnsureNamespace(ctx, c.Client, ns); err != nil {
			_ = c.Stop()
			return nil, err
		}
	}
	return c, nil
}

// Stop stops kube-apiserver and etcd and removes their directories.
func (c *Cluster) Stop() error {
	if c == nil || c.Env == nil {
		return nil
	}
	return c.Env.Stop()
}

// kubernetesServiceIP is the `kubernetes` Service's address: the first of ServiceCIDR.
const kubernetesServiceIP = "10.0.0.1"

// writeAPIServerCerts writes into dir what envtest would (apiserver.crt and .key, the
// service-account signer sa-signer.crt and .key), the serving certificate for localhost,
// 127.0.0.1, NodeIP and kubernetesServiceIP, and returns its CA.
func writeAPIServerCerts(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	serving, err := NewServingCert("kube-apiserver", net.ParseIP(NodeIP), net.ParseIP(kubernetesServiceIP))
	if err != nil {
		return nil, err
	}
	signer, err := NewServingCert("service-account-signer")
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{
		"apiserver.crt": serving.CertPEM, "apiserver.key": serving.KeyPEM,
		"sa-signer.crt": signer.CertPEM, "sa-signer.key": signer.KeyPEM,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return serving.CAPEM, nil
}

// FreePort asks the kernel for a free loopback port.
func FreePort() (int, error) { return freePortOn("127.0.0.1") }

// freePortOn asks the kernel for a free port on the address ip.
func freePortOn(ip string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return strconv.Atoi(p)
}

func chmodTree(dir string) error {
	return filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
}
