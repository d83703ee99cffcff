// Command tokenplugin is the upstream of the e2e suite's `exec` provider: a kubeconfig exec
// plugin (client.authentication.k8s.io/v1) that prints the token kept in a file for the
// cluster named by KUBERNETES_EXEC_INFO's spec.cluster.config.clusterName and counts its runs,
// one line per run in a log file, so the test knows how many upstream fetches happened. When
// TOKEN_DIR holds NAME.crt and NAME.key instead, it prints that client certificate and key.
//
// The credential's expirationTimestamp is TOKEN_LIFETIME (a Go duration) from now, default one
// hour. While TOKEN_DIR holds a file named DOWN the upstream is down: the plugin fails, and
// logs the run in RUN_LOG.fail instead.
//
// Usage: tokenplugin TOKEN_DIR RUN_LOG
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fail("usage: tokenplugin TOKEN_DIR RUN_LOG")
	}
	var info struct {
		APIVersion string `json:"apiVersion"`
		Spec       struct {
			Cluster *struct {
				Server string         `json:"server"`
				Config map[string]any `json:"config"`
			} `json:"cluster"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(os.Getenv("KUBERNETES_EXEC_INFO")), &info); err != nil {
		fail("KUBERNETES_EXEC_INFO: " + err.Error())
	}
	if info.Spec.Cluster == nil {
		fail("no spec.cluster (provideClusterInfo off?)")
	}
	name, _ := info.Spec.Cluster.Config["clusterName"].(string)
	if name == "" || strings.ContainsAny(name, "/.") {
		fail("no usable clusterName in spec.cluster.config")
	}
	if _, err := os.Stat(filepath.Join(os.Args[1], "DOWN")); err == nil {
		logRun(os.Args[2]+".fail", name, info.Spec.Cluster.Server)
		fail("the upstream is down (DOWN)")
	}
	lifetime := time.Hour
	if v := os.Getenv("TOKEN_LIFETIME"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fail("TOKEN_LIFETIME: not a positive duration: " + v)
		}
		lifetime = d
	}
	status := map[string]any{"expirationTimestamp": time.Now().Add(lifetime).UTC().Format(time.RFC3339)}
	base := filepath.Join(os.Args[1], name)
	if crt, err := os.ReadFile(base + ".crt"); err == nil {
		key, err := os.ReadFile(base + ".key")
		if err != nil {
			fail(err.Error())
		}
		status["clientCertificateData"] = string(crt)
		status["clientKeyData"] = string(key)
	} else {
		tok, err := os.ReadFile(base)
		if err != nil {
			fail(err.Error())
		}
		status["token"] = strings.TrimSpace(string(tok))
	}
	logRun(os.Args[2], name, info.Spec.Cluster.Server)
	apiVersion := info.APIVersion
	if apiVersion == "" {
		apiVersion = "client.authentication.k8s.io/v1"
	}
	out, _ := json.Marshal(map[string]any{
		"apiVersion": apiVersion,
		"kind":       "ExecCredential",
		"status":     status,
	})
	os.Stdout.Write(append(out, '\n'))
}

// logRun appends one line for this run: time, cluster name, server.
func logRun(path, name, server string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fail(err.Error())
	}
	fmt.Fprintf(f, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), name, server)
	f.Close()
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "tokenplugin: "+msg)
	os.Exit(1)
}
