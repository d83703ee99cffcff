package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestReaskChecks: the broker checks a re-ask (the same caller asking again before its
// come-back time) with the cluster's real API server before it fetches anew, with client
// certificates (the API server's client CA decides, in the TLS handshake) and with
// tls-server-name. This test process runs the shim twice with the same environment, as a
// process with a second authenticator for a cluster does.
func TestReaskChecks(t *testing.T) {
	w := fw.Fleet.Workers[0]
	dir := fw.Dir("reask")
	run := filepath.Join(dir, "run")
	for _, d := range []string{filepath.Join(run, "tokens")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(run, 65532, 65532); err != nil {
		t.Fatal(err)
	}
	// A client certificate the worker trusts (envtest's client CA signs it) and one it does not.
	user, err := w.Env.AddUser(envtest.User{Name: "reask-user", Groups: []string{"system:authenticated"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	trusted := user.Config().TLSClientConfig
	untrustedCert, untrustedKey := selfSigned(t)
	for name, pair := range map[string][2][]byte{
		"trusted":   {trusted.CertData, trusted.KeyData},
		"named":     {trusted.CertData, trusted.KeyData},
		"misnamed":  {trusted.CertData, trusted.KeyData},
		"untrusted": {untrustedCert, untrustedKey},
	} {
		writeFile(t, filepath.Join(run, "tokens", name+".crt"), string(pair[0]))
		writeFile(t, filepath.Join(run, "tokens", name+".key"), string(pair[1]))
	}
	b := startExecBroker(t, dir, run)
	u, err := url.Parse(w.Server)
	if err != nil {
		t.Fatal(err)
	}
	// The API server by address, its certificate verified against tls-server-name instead.
	byIP := "https://" + u.Host
	ask := func(cluster, server, tlsName string) string {
		t.Helper()
		c := map[string]any{"server": server, "certificate-authority-data": base64.StdEncoding.EncodeToString(w.CAData),
			"config": map[string]any{"clusterName": cluster}}
		if tlsName != "" {
			c["tls-server-name"] = tlsName
		}
		info, _ := json.Marshal(map[string]any{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
			"spec": map[string]any{"interactive": false, "cluster": c}})
		cmd := exec.Command(filepath.Join(fw.Content, "plugins/bin/credbroker-shim"), "--provider", "onprem", "--socket", b.SocketHost)
		cmd.Env = []string{"KUBERNETES_EXEC_INFO=" + string(info), "PATH=/usr/bin:/bin"}
		// As Kueue's uid (the deploy's allowedUids); the parent is this multi-threaded process.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("shim for %s: %v: %s", cluster, err, stderrOf(err))
		}
		var cred struct {
			Status struct {
				ClientCertificateData string `json:"clientCertificateData"`
			} `json:"status"`
		}
		if err := json.Unmarshal(out, &cred); err != nil || cred.Status.ClientCertificateData == "" {
			t.Fatalf("shim for %s printed no client certificate: %v %s", cluster, err, out)
		}
		return cred.Status.ClientCertificateData
	}
	runsOf := func(cluster string) int {
		b, _ := os.ReadFile(filepath.Join(run, "runs.log"))
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[1] == cluster {
				n++
			}
		}
		return n
	}
	answers := func() map[string]float64 {
		m, err := b.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, a := range []string{"accepted", "rejected", "unreachable", "unchecked"} {
			out[a] = harness.Sum(m, "credbroker_reask_checks_total", `provider="onprem"`, fmt.Sprintf(`answer="%s"`, a))
		}
		return out
	}
	cases := []struct {
		cluster, server, tlsName, want string
		runs                           int
	}{
		// The worker's client CA signed it: the server accepts it (201), nothing is fetched.
		{"trusted", w.Server, "", "accepted", 1},
		// Reached by IP, verified as localhost (the name its serving certificate carries).
		{"named", byIP, "localhost", "accepted", 1},
		// A tls-server-name the certificate does not carry: the check cannot verify the
		// server, as client-go could not; the held certificate stays in service.
		{"misnamed", byIP, "not-the-server.invalid", "unreachable", 1},
		// A certificate the worker does not trust: 401, a confirmed rejection, fetched anew
		// (the plugin hands out the same certificate again, which the broker reports).
		{"untrusted", w.Server, "", "rejected", 2},
	}
	for _, c := range cases {
		before := answers()
		first := ask(c.cluster, c.server, c.tlsName)
		second := ask(c.cluster, c.server, c.tlsName)
		after := answers()
		t.Logf("%s (server %s, tls-server-name %q): re-ask checked %v; %d plugin runs", c.cluster, c.server, c.tlsName, diff(before, after), runsOf(c.cluster))
		if first != second {
			t.Errorf("%s: the re-ask got another certificate", c.cluster)
		}
		for a, v := range after {
			want := 0.0
			if a == c.want {
				want = 1
			}
			if v-before[a] != want {
				t.Errorf("%s: %s checks went up by %v, want %v", c.cluster, a, v-before[a], want)
			}
		}
		if got := runsOf(c.cluster); got != c.runs {
			t.Errorf("%s: plugin runs = %d, want %d", c.cluster, got, c.runs)
		}
	}
	if lines := b.LogLines("rejection confirmed"); len(lines) != 1 || !strings.Contains(lines[0], w.Server) {
		t.Errorf("want one 'rejection confirmed' line naming %s: %q", w.Server, lines)
	}
	if lines := b.LogLines("got back the very credential that was rejected"); len(lines) != 1 {
		t.Errorf("want the rejected certificate reported as handed out again: %q", lines)
	}
	if strings.Contains(b.LogText(), "PRIVATE KEY") {
		t.Errorf("the broker log holds a private key")
	}
}

func diff(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// selfSigned is a client certificate and key (PEM) no API server of the suite trusts.
func selfSigned(t *testing.T) ([]byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nobody-trusts-me"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}
