package harness

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// The cloud workers' stand-ins (clouds_test.go): each cloud's identity endpoints and each
// worker's token verifier, on loopback. What is real and what stands in, and why, is in
// e2e/README.md ("Cloud workers").

// FakeCloud is one cloud's endpoints on loopback HTTPS with a CA of its own, as the broker
// and the workers' kube-apiservers meet a cloud: the broker trusts the CA through
// SSL_CERT_FILE (CAFile, mounted at FakeCAMount), kube-apiserver through the CA its
// authentication configuration or webhook kubeconfig names.
type FakeCloud struct {
	URL    string // https://127.0.0.1:PORT
	CAPEM  []byte
	CADir  string // holds ca.crt: mount it at FakeCAMount
	Mux    *http.ServeMux
	srv    *http.Server
	client *http.Client

	mu         sync.Mutex
	violations []string
}

// FakeCAMount is where the broker's container finds the fakes' CA (SSL_CERT_FILE names
// FakeCAMount/ca.crt): the broker's one trust rule adds it to the system's roots.
const FakeCAMount = "/etc/e2e-cloud"

// FakeCAFile is SSL_CERT_FILE in the broker's container.
const FakeCAFile = FakeCAMount + "/ca.crt"

// StartFakeCloud serves mux-registered handlers over HTTPS on 127.0.0.1.
func StartFakeCloud(dir, name string) (*FakeCloud, error) {
	cert, err := NewServingCert(name)
	if err != nil {
		return nil, err
	}
	f := &FakeCloud{CAPEM: cert.CAPEM, CADir: filepath.Join(dir, "ca"), Mux: http.NewServeMux()}
	if err := os.MkdirAll(f.CADir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(f.CADir, "ca.crt"), cert.CAPEM, 0o644); err != nil {
		return nil, err
	}
	cfg, err := cert.TLS()
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		return nil, err
	}
	f.URL = "https://" + ln.Addr().String()
	f.srv = &http.Server{Handler: f.Mux, ReadHeaderTimeout: FakeCallTimeout}
	go func() { _ = f.srv.Serve(ln) }()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert.CAPEM)
	f.client = &http.Client{Timeout: FakeCallTimeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return f, nil
}

// Close stops serving.
func (f *FakeCloud) Close() {
	if f != nil && f.srv != nil {
		_ = f.srv.Close()
	}
}

// Client is an HTTP client that trusts the fake's CA (a webhook calling its cloud).
func (f *FakeCloud) Client() *http.Client { return f.client }

// violation records a request the fake refused because it was not what the real service
// accepts: the tests assert there are none.
func (f *FakeCloud) violation(format string, args ...any) string {
	why := fmt.Sprintf(format, args...)
	f.mu.Lock()
	f.violations = append(f.violations, why)
	f.mu.Unlock()
	return why
}

// Violations are the requests refused as malformed so far.
func (f *FakeCloud) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.violations...)
}

// WebhookKubeconfig writes the kubeconfig kube-apiserver's
// --authentication-token-webhook-config-file names: the fake's URL path, its CA.
func (f *FakeCloud) WebhookKubeconfig(path, urlPath string) error {
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: webhook
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: kube-apiserver
  user: {}
contexts:
- name: webhook
  context: {cluster: webhook, user: kube-apiserver}
current-context: webhook
`, f.URL+urlPath, b64(f.CAPEM))
	return os.WriteFile(path, []byte(text), 0o600)
}

// WebhookFlags are kube-apiserver's flags for a token webhook at kubeconfig: TokenReview v1,
// and no cache of the webhook's answers (kube-apiserver still keeps a success for 10 s:
// TokenCacheWait), so a revocation bites as soon as it can.
func WebhookFlags(kubeconfig string) map[string]string {
	return map[string]string{
		"authentication-token-webhook-config-file": kubeconfig,
		"authentication-token-webhook-version":     "v1",
		"authentication-token-webhook-cache-ttl":   "0s",
	}
}

// tokenReview is the TokenReview (authentication.k8s.io/v1) a token webhook gets and answers.
type tokenReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		Token string `json:"token"`
	} `json:"spec"`
	Status struct {
		Authenticated bool   `json:"authenticated"`
		Error         string `json:"error,omitempty"`
		User          *struct {
			Username string   `json:"username"`
			UID      string   `json:"uid,omitempty"`
			Groups   []string `json:"groups,omitempty"`
		} `json:"user,omitempty"`
	} `json:"status"`
}

// serveTokenReview answers kube-apiserver's TokenReview with check's user, or unauthenticated
// with its error (kube-apiserver answers the caller 401).
func serveTokenReview(check func(token string) (user string, groups []string, err error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var tr tokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil || tr.Kind != "TokenReview" {
			http.Error(w, "not a TokenReview", http.StatusBadRequest)
			return
		}
		user, groups, err := check(tr.Spec.Token)
		tr.Spec.Token = ""
		if err != nil {
			tr.Status.Error = err.Error()
		} else {
			tr.Status.Authenticated = true
			tr.Status.User = &struct {
				Username string   `json:"username"`
				UID      string   `json:"uid,omitempty"`
				Groups   []string `json:"groups,omitempty"`
			}{Username: user, Groups: groups}
		}
		writeJSON(w, http.StatusOK, tr)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// randomToken is an opaque token with prefix, as clouds hand out access tokens.
func randomToken(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// fingerprint names a token in a fake's bookkeeping without keeping it.
func fingerprint(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:8])
}

var b64url = base64.RawURLEncoding

// signRS256 is a compact JWS of claims signed with key (RS256, kid).
func signRS256(key *rsa.PrivateKey, kid string, claims map[string]any) (string, error) {
	h, _ := json.Marshal(map[string]any{"alg": "RS256", "typ": "JWT", "kid": kid})
	c, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	input := b64url.EncodeToString(h) + "." + b64url.EncodeToString(c)
	sum := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return input + "." + b64url.EncodeToString(sig), nil
}

// rsaJWK is key's public half as a JWKS entry.
func rsaJWK(kid string, key *rsa.PublicKey) map[string]any {
	return map[string]any{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
		"n": b64url.EncodeToString(key.N.Bytes()), "e": b64url.EncodeToString(big.NewInt(int64(key.E)).Bytes())}
}

// KeyIssuer is a Kubernetes cluster as an OIDC issuer of its ServiceAccount tokens, as a cloud
// that federates with it sees it: the issuer its discovery document names and the keys its
// JWKS serves (/.well-known/openid-configuration, /openid/v1/jwks), read once.
type KeyIssuer struct {
	Issuer string
	keys   map[string]crypto.PublicKey
}

// LoadIssuer reads c's issuer and keys.
func LoadIssuer(ctx context.Context, c *Cluster) (*KeyIssuer, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, err
	}
	rc := cs.RESTClient()
	var disc struct {
		Issuer string `json:"issuer"`
	}
	var jwks struct {
		Keys []struct {
			Kty, Kid, Crv, X, Y, N, E string
		} `json:"keys"`
	}
	for path, into := range map[string]any{"/.well-known/openid-configuration": &disc, "/openid/v1/jwks": &jwks} {
		raw, err := rc.Get().AbsPath(path).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: GET %s: %w", c.Name, path, err)
		}
		if err := json.Unmarshal(raw, into); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", c.Name, path, err)
		}
	}
	k := &KeyIssuer{Issuer: disc.Issuer, keys: map[string]crypto.PublicKey{}}
	for _, j := range jwks.Keys {
		switch {
		case j.Kty == "EC" && j.Crv == "P-256":
			x, _ := b64url.DecodeString(j.X)
			y, _ := b64url.DecodeString(j.Y)
			k.keys[j.Kid] = &ecdsa.PublicKey{Curve: elliptic.P256(), X: new(big.Int).SetBytes(x), Y: new(big.Int).SetBytes(y)}
		case j.Kty == "RSA":
			n, _ := b64url.DecodeString(j.N)
			e, _ := b64url.DecodeString(j.E)
			k.keys[j.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		}
	}
	if k.Issuer == "" || len(k.keys) == 0 {
		return nil, fmt.Errorf("%s: no issuer or no keys in its discovery document and JWKS", c.Name)
	}
	return k, nil
}

// Verify checks a ServiceAccount token as a federating cloud does (signature with the
// issuer's key, issuer, audience, expiry, subject) and returns its claims.
func (k *KeyIssuer) Verify(tok, audience, subject string) (map[string]any, error) {
	claims, err := verifyJWT(tok, k.keys)
	if err != nil {
		return nil, err
	}
	if claims["iss"] != k.Issuer {
		return nil, fmt.Errorf("issuer %v is not %s", claims["iss"], k.Issuer)
	}
	if !hasAudience(claims["aud"], audience) {
		return nil, fmt.Errorf("audience %v does not name %s", claims["aud"], audience)
	}
	if exp, _ := claims["exp"].(float64); time.Unix(int64(exp), 0).Before(time.Now()) {
		return nil, fmt.Errorf("expired")
	}
	if claims["sub"] != subject {
		return nil, fmt.Errorf("subject %v is not %s", claims["sub"], subject)
	}
	return claims, nil
}

// KueueSubject is the hub pod's ServiceAccount as a token's subject: what each cloud's
// federation trusts (docs/deploy.md section 6, docs/cross-cloud.md).
const KueueSubject = "system:serviceaccount:" + KueueNamespace + ":" + KueueServiceAccount

func hasAudience(aud any, want string) bool {
	switch a := aud.(type) {
	case string:
		return a == want
	case []any:
		for _, x := range a {
			if x == want {
				return true
			}
		}
	}
	return false
}

// verifyJWT checks a compact JWS's signature (ES256 or RS256) with the key its kid names.
func verifyJWT(tok string, keys map[string]crypto.PublicKey) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("not a JWT")
	}
	var hdr struct{ Alg, Kid string }
	raw, err := b64url.DecodeString(parts[0])
	if err != nil || json.Unmarshal(raw, &hdr) != nil {
		return nil, fmt.Errorf("bad JWT header")
	}
	sig, err := b64url.DecodeString(parts[2])
	if err != nil {
		return nil, fmt.Errorf("bad JWT signature encoding")
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	ok := false
	switch key := keys[hdr.Kid].(type) {
	case *ecdsa.PublicKey:
		ok = hdr.Alg == "ES256" && len(sig) == 64 &&
			ecdsa.Verify(key, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:]))
	case *rsa.PublicKey:
		ok = hdr.Alg == "RS256" && rsa.VerifyPKCS1v15(key, crypto.SHA256, sum[:], sig) == nil
	default:
		return nil, fmt.Errorf("no key %q", hdr.Kid)
	}
	if !ok {
		return nil, fmt.Errorf("signature does not verify")
	}
	claims := map[string]any{}
	raw, err = b64url.DecodeString(parts[1])
	if err != nil || json.Unmarshal(raw, &claims) != nil {
		return nil, fmt.Errorf("bad JWT claims")
	}
	return claims, nil
}

// listenPlain is a plain-HTTP loopback server (the GCE metadata server is plain HTTP).
func listenPlain(h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: FakeCallTimeout}
	go func() { _ = srv.Serve(ln) }()
	return srv, ln.Addr().String(), nil
}
