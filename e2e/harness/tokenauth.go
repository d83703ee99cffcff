package harness

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// TokenAuth is the bearer-token authenticator of the worker API servers: a TokenReview
// webhook (--authentication-token-webhook-config-file, v1, cache TTL 0) served by the test,
// so a token is valid exactly while the test says so. Each worker has its own path.
type TokenAuth struct {
	URL  string // https://127.0.0.1:PORT
	cert *ServingCert
	srv  *http.Server

	mu     sync.Mutex
	tokens map[string]map[string]bool // worker -> token -> valid

	Reviews  atomic.Int64 // TokenReviews answered
	Accepted atomic.Int64
	Rejected atomic.Int64
}

// StartTokenAuth serves TokenReviews on a loopback port.
func StartTokenAuth() (*TokenAuth, error) {
	cert, err := NewServingCert("token-webhook")
	if err != nil {
		return nil, err
	}
	tlsCfg, err := cert.TLS()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &TokenAuth{URL: "https://" + ln.Addr().String(), cert: cert, tokens: map[string]map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/authenticate/", a.review)
	a.srv = &http.Server{Handler: mux, TLSConfig: tlsCfg}
	go func() { _ = a.srv.ServeTLS(ln, "", "") }()
	return a, nil
}

func (a *TokenAuth) review(w http.ResponseWriter, r *http.Request) {
	worker := strings.TrimPrefix(r.URL.Path, "/authenticate/")
	var review struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Token string `json:"token"`
		} `json:"spec"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&review); err != nil {
		http.Error(w, "bad TokenReview", http.StatusBadRequest)
		return
	}
	a.Reviews.Add(1)
	a.mu.Lock()
	ok := a.tokens[worker][review.Spec.Token]
	a.mu.Unlock()
	status := map[string]any{"authenticated": false}
	if ok {
		a.Accepted.Add(1)
		status = map[string]any{
			"authenticated": true,
			"user": map[string]any{
				"username": "credbroker-e2e:" + worker,
				"groups":   []string{"system:masters", "system:authenticated"},
			},
		}
	} else {
		a.Rejected.Add(1)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenReview",
		"status":     status,
	})
}

// Issue mints a new random token valid on worker.
func (a *TokenAuth) Issue(worker string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	token := "e2e-" + worker + "-" + hex.EncodeToString(b)
	a.Allow(worker, token)
	return token
}

// Allow makes token valid on worker.
func (a *TokenAuth) Allow(worker, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tokens[worker] == nil {
		a.tokens[worker] = map[string]bool{}
	}
	a.tokens[worker][token] = true
}

// RevokeAll makes every token of worker invalid; returns how many there were.
func (a *TokenAuth) RevokeAll(worker string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.tokens[worker])
	delete(a.tokens, worker)
	return n
}

// WebhookKubeconfig is the file kube-apiserver reads to reach this authenticator for worker.
func (a *TokenAuth) WebhookKubeconfig(worker string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: token-webhook
  cluster:
    server: %s/authenticate/%s
    certificate-authority-data: %s
users:
- name: kube-apiserver
  user: {}
contexts:
- name: webhook
  context: {cluster: token-webhook, user: kube-apiserver}
current-context: webhook
`, a.URL, worker, b64(a.cert.CAPEM))
}

// Close stops serving.
func (a *TokenAuth) Close() { _ = a.srv.Close() }
