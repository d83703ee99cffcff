// Command fleet is the client-go side of the bench's fleet cold start (bench section
// "anchors"): a controller restarting with one worker cluster per kubeconfig context. It reads
// a kubeconfig, and for every context at once builds a client-go REST client (the context's
// cluster and its exec user, as clientcmd resolves them: provideClusterInfo, the cluster's
// client.authentication.k8s.io/exec extension) and makes one request (GET /version), so
// client-go runs each context's exec plugin once. It prints one JSON object on stdout: the
// wall time from the first client built to the last answer, requests that succeeded and
// failed, the first error, and the largest max RSS of the plugin processes client-go ran
// (getrusage RUSAGE_CHILDREN: every plugin is a child of this process and has been waited
// for). It exits 0 when it could run, whatever failed; the bench reads the JSON.
//
// Usage: fleet -kubeconfig FILE [-timeout 120s]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// result is what the bench reads.
type result struct {
	Clusters          int     `json:"clusters"`
	OK                int     `json:"ok"`
	Failed            int     `json:"failed"`
	FirstError        string  `json:"first_error,omitempty"`
	WallMS            float64 `json:"wall_ms"`
	P50MS             float64 `json:"p50_ms"`
	P99MS             float64 `json:"p99_ms"`
	ChildrenMaxRSSKiB int64   `json:"children_max_rss_kib"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the fleet's kubeconfig: one context per cluster")
	timeout := flag.Duration("timeout", 120*time.Second, "bound on the whole run")
	flag.Parse()
	if *kubeconfig == "" {
		fail("usage: fleet -kubeconfig FILE [-timeout 120s]")
	}
	cfg, err := clientcmd.LoadFromFile(*kubeconfig)
	if err != nil {
		fail("kubeconfig: %v", err)
	}
	names := make([]string, 0, len(cfg.Contexts))
	for n := range cfg.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		res      = result{Clusters: len(names)}
		took     = make([]time.Duration, 0, len(names))
		start    = make(chan struct{})
		began    time.Time
		recordOK = func(d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			res.OK++
			took = append(took, d)
		}
		recordErr = func(name string, err error) {
			mu.Lock()
			defer mu.Unlock()
			res.Failed++
			if res.FirstError == "" {
				res.FirstError = fmt.Sprintf("%s: %v", name, err)
			}
		}
	)
	for _, name := range names {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			<-start
			t := time.Now()
			rc, err := clientcmd.NewNonInteractiveClientConfig(*cfg, name, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
			if err != nil {
				recordErr(name, err)
				return
			}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				recordErr(name, err)
				return
			}
			if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
				recordErr(name, err)
				return
			}
			recordOK(time.Since(t))
		}(name)
	}
	began = time.Now()
	close(start)
	wg.Wait()
	res.WallMS = ms(time.Since(began))
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	res.P50MS = ms(rank(took, 0.50))
	res.P99MS = ms(rank(took, 0.99))
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err == nil {
		res.ChildrenMaxRSSKiB = ru.Maxrss // KiB on Linux
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fail("write: %v", err)
	}
}

// rank is the nearest-rank percentile of sorted durations.
func rank(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "fleet: "+format+"\n", a...)
	os.Exit(2)
}
