package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"credbroker.dev/e2e/harness"
	"github.com/onsi/gomega"
)

// TestKubectlThroughTheShim: the real kubectl (client-go's exec client) through the shim and
// the broker against a real worker API server, as Kueue's uid. One-shot runs, first use
// included, fetch once and make no re-ask; long-lived kubectl proxy processes whose token the
// worker revokes (its ServiceAccount deleted and made anew, as an operator does) recover at their next request with one upstream fetch, after the broker's
// check got the worker's 401 (one confirmed rejection for both).
func TestKubectlThroughTheShim(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is missing (scripts/test.sh installs it): %v", err)
	}
	w := fw.Fleet.Workers[1]
	dir := fw.Dir("kubectl")
	run := filepath.Join(dir, "run")
	home := filepath.Join(dir, "home")
	for _, d := range []string{filepath.Join(run, "tokens"), home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{run, home} {
		if err := os.Chown(d, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	const cluster = "kubectl-1"
	first := workerToken(t, w)
	writeFile(t, filepath.Join(run, "tokens", cluster), first+"\n")
	b := startExecBroker(t, dir, run)
	// The shim where uid 65532 can run it (the image content may sit under root's home).
	shim := filepath.Join(dir, "credbroker-shim")
	if out, err := exec.Command("cp", filepath.Join(fw.Content, "plugins/bin/credbroker-shim"), shim).CombinedOutput(); err != nil {
		t.Fatalf("copy the shim: %v: %s", err, out)
	}
	kc := map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": "w",
		"clusters": []any{map[string]any{"name": "w", "cluster": map[string]any{
			"server": w.Server, "certificate-authority-data": base64.StdEncoding.EncodeToString(w.CAData),
			"extensions": []any{map[string]any{"name": "client.authentication.k8s.io/exec", "extension": map[string]any{"clusterName": cluster}}},
		}}},
		"users": []any{map[string]any{"name": "u", "user": map[string]any{"exec": map[string]any{
			"apiVersion": "client.authentication.k8s.io/v1", "command": shim,
			"args":               []any{"--provider", "onprem", "--socket", b.SocketHost},
			"provideClusterInfo": true, "interactiveMode": "Never",
		}}}},
		"contexts": []any{map[string]any{"name": "w", "context": map[string]any{"cluster": "w", "user": "u"}}},
	}
	kcText, _ := json.Marshal(kc)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, string(kcText))
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(home, "cache")}, args...)...)
		cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin"}
		// Kueue's uid, the deploy's socket.allowedUids.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65532, Gid: 65532}, Setpgid: true}
		return cmd
	}
	runs := func() int {
		b, _ := os.ReadFile(filepath.Join(run, "runs.log"))
		return strings.Count(string(b), " "+cluster+" ")
	}
	c0, _ := b.CountsFor("onprem")
	// What the worker identity may do: discovery, its own identity, and the Workloads it lists
	// (deploy/examples/worker-rbac).
	oneShots := [][]string{{"get", "--raw", "/version"}, {"get", "--raw", "/api"}, {"auth", "whoami"}, {"get", "workloads.kueue.x-k8s.io", "-A"}}
	n := 0
	for i := 0; i < 3; i++ {
		for _, args := range oneShots {
			if out, err := command(args...).CombinedOutput(); err != nil {
				t.Fatalf("kubectl %v: %v\n%s\nbroker log:\n%s", args, err, out, harness.Tail(b.LogText(), 20))
			}
			n++
		}
	}
	c1, _ := b.CountsFor("onprem")
	t.Logf("%d one-shot kubectl runs: %v GetToken calls, %d plugin run(s), %v re-asks", n, c1.Requests-c0.Requests, runs(), c1.Reasks-c0.Reasks)
	if runs() != 1 || c1.Reasks != c0.Reasks || len(b.LogLines(" WARN ")) > 0 {
		t.Errorf("one-shot runs: %d plugin runs (want 1), %v re-asks (want 0), warnings %q", runs(), c1.Reasks-c0.Reasks, b.LogLines(" WARN "))
	}

	// Two long-lived client-go processes.
	type proxy struct {
		cmd  *exec.Cmd
		port string
	}
	var proxies []proxy
	defer func() {
		for _, p := range proxies {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			_ = p.cmd.Wait()
		}
	}()
	for i := 0; i < 2; i++ {
		cmd := command("proxy", "--port=0", "--address=127.0.0.1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1)
		go func() {
			line, _ := bufio.NewReader(out).ReadString('\n')
			lines <- line
			_, _ = io.Copy(io.Discard, out)
		}()
		var line string
		gomega.NewWithT(t).Eventually(lines).WithTimeout(harness.ProcessOutputTimeout).WithPolling(harness.FastInterval).
			Should(gomega.Receive(&line), "kubectl proxy printed no address")
		proxies = append(proxies, proxy{cmd: cmd, port: line[strings.LastIndexByte(strings.TrimSpace(line), ':')+1:]})
	}
	get := func(p proxy) int {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%s/api", strings.TrimSpace(p.port)))
		if err != nil {
			t.Fatalf("GET through kubectl proxy: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range proxies {
		if code := get(p); code != 200 {
			t.Fatalf("kubectl proxy answered %d", code)
		}
	}
	// The worker revokes the token; the plugin now hands out a new one.
	if err := w.RevokeWorkerIdentity(context.Background()); err != nil {
		t.Fatal(err)
	}
	fresh := workerToken(t, w)
	writeFile(t, filepath.Join(run, "tokens", cluster), fresh+"\n")
	// kube-apiserver keeps a successful token authentication for 10 s.
	time.Sleep(harness.TokenCacheWait)
	for i, p := range proxies {
		tries := 0
		for tries < 3 {
			tries++
			if get(p) == 200 {
				break
			}
		}
		t.Logf("kubectl proxy %d: 200 again at request %d after the revocation", i, tries)
		// The first request meets the 401 (client-go then runs the plugin again); the second
		// carries the new credential.
		if tries != 2 || get(p) != 200 {
			t.Errorf("kubectl proxy %d recovered at request %d; want its second, as client-go does after a 401", i, tries)
		}
	}
	c2, _ := b.CountsFor("onprem")
	t.Logf("revoked: %d plugin runs in all, %v re-asks, %v confirmed rejections", runs(), c2.Reasks-c1.Reasks, c2.Rejected-c1.Rejected)
	if runs() != 2 || c2.Rejected-c1.Rejected != 1 || c2.Unchecked != c0.Unchecked {
		t.Errorf("after the revocation: %d plugin runs (want 2), %v confirmed rejections (want 1), %v unchecked", runs(), c2.Rejected-c1.Rejected, c2.Unchecked-c0.Unchecked)
	}
	noTokenIn(t, "the broker log", b.LogText(), first, fresh)
}
