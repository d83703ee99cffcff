package harness

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Moto is moto's server (`python3 -m moto.server`, what scripts/test.sh installs for the Rust
// tests) standing in for AWS STS: AssumeRoleWithWebIdentity for the broker's IRSA credentials
// and GetCallerIdentity for the EKS-like worker's webhook. It does not verify the web
// identity token nor SigV4 signatures (EKSWebhook verifies the signature itself).
type Moto struct {
	URL    string // http://127.0.0.1:PORT: AWS_ENDPOINT_URL_STS
	daemon *Daemon
}

// StartMoto starts moto on a free loopback port, logging into dir/moto.log.
func StartMoto(ctx context.Context, dir string) (*Moto, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	m := &Moto{URL: fmt.Sprintf("http://127.0.0.1:%d", port)}
	m.daemon = &Daemon{Name: "moto", Log: filepath.Join(dir, "moto.log"),
		Argv: []string{"python3", "-m", "moto.server", "-H", "127.0.0.1", "-p", fmt.Sprint(port)}}
	if err := m.daemon.Start(); err != nil {
		return nil, err
	}
	err = Eventually(ctx, MotoStartTimeout, FastInterval, func() error {
		if !m.daemon.Running() {
			return StopTrying(fmt.Errorf("moto exited (pip install 'moto[server]'): %s", Tail(m.daemon.LogText(), 10)))
		}
		_, err := m.sessions()
		return err
	})
	if err != nil {
		m.Stop()
		return nil, err
	}
	return m, nil
}

// Stop stops moto.
func (m *Moto) Stop() {
	if m != nil && m.daemon != nil {
		_ = m.daemon.Stop(QuickStopGrace)
	}
}

// motoSession is one session moto issued (AssumeRole or AssumeRoleWithWebIdentity).
type motoSession struct {
	AccessKeyID     string `json:"access_key_id"`
	SecretAccessKey string `json:"secret_access_key"`
	SessionToken    string `json:"session_token"`
	RoleArn         string `json:"role_arn"`
}

// sessions are the sessions moto issued so far (its /moto-api/data.json).
func (m *Moto) sessions() ([]motoSession, error) {
	c := http.Client{Timeout: FakeCallTimeout}
	resp, err := c.Get(m.URL + "/moto-api/data.json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("moto data: %s", resp.Status)
	}
	var data struct {
		STS struct {
			AssumedRole []motoSession `json:"AssumedRole"`
		} `json:"sts"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&data); err != nil {
		return nil, err
	}
	return data.STS.AssumedRole, nil
}

// Sessions is how many role sessions moto issued: the broker's upstream credential fetches.
func (m *Moto) Sessions() (int, error) {
	s, err := m.sessions()
	return len(s), err
}

// AccessEntry maps an IAM role to Kubernetes groups on an EKS cluster (`aws eks
// create-access-entry --principal-arn ROLE --kubernetes-groups GROUP`); its username for a
// role is arn:aws:sts::ACCOUNT:assumed-role/ROLE/{{SessionName}}.
type AccessEntry struct {
	PrincipalArn string
	Groups       []string
}

// EKSWebhook is the EKS-like worker's token webhook (POST /eks/authenticate on a FakeCloud),
// doing what aws-iam-authenticator's server does with a `k8s-aws-v1.` token: decode the
// presigned GetCallerIdentity URL and check it (https, an STS host of the region, path /,
// Action=GetCallerIdentity, Version, only the parameters it allows, X-Amz-Date within 15
// minutes, `x-k8s-aws-id` among the signed headers), replay it against STS (moto) with the
// `x-k8s-aws-id` header set to the cluster's name, and map the returned ARN (an assumed
// role, canonicalised to its role) through the access entries. moto verifies no signature,
// so the webhook verifies the SigV4 signature itself with the session's secret from moto's
// state: a token signed for another cluster name, or altered, is refused as STS refuses it.
type EKSWebhook struct {
	Region string
	// Clusters are the names the worker answers to: one API server stands for the ten EKS
	// clusters of the fan-out (each ClusterProfile names its own), and the signed
	// x-k8s-aws-id must be one of them.
	Clusters []string

	moto    *Moto
	client  *http.Client
	mu      sync.Mutex
	entries map[string]AccessEntry
	seen    map[string]bool // cluster names tokens were signed for
	counts  struct{ accepted, rejected, unmapped int }
}

// NewEKSWebhook serves the webhook on fc for clusters in region, replaying against moto.
func NewEKSWebhook(fc *FakeCloud, m *Moto, region string, clusters []string) *EKSWebhook {
	h := &EKSWebhook{Region: region, Clusters: clusters, moto: m, client: &http.Client{Timeout: FakeCallTimeout},
		entries: map[string]AccessEntry{}, seen: map[string]bool{}}
	fc.Mux.HandleFunc("POST /eks/authenticate", serveTokenReview(h.review))
	return h
}

// SetAccessEntry adds (or with nil groups removes) the access entry of a role.
func (h *EKSWebhook) SetAccessEntry(roleArn string, groups []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if groups == nil {
		delete(h.entries, roleArn)
		return
	}
	h.entries[roleArn] = AccessEntry{PrincipalArn: roleArn, Groups: groups}
}

// Counts are the TokenReviews accepted, refused, and refused for want of an access entry.
func (h *EKSWebhook) Counts() (accepted, rejected, unmapped int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts.accepted, h.counts.rejected, h.counts.unmapped
}

// ClustersSeen are the cluster names of the tokens accepted so far.
func (h *EKSWebhook) ClustersSeen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for n := range h.seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// EKSTokenPrefix begins every EKS token (aws eks get-token's and the broker's).
const EKSTokenPrefix = "k8s-aws-v1."

// eksAllowedParams are the query parameters aws-iam-authenticator accepts in a token's URL
// (pkg/token/token.go, parameterWhitelist), lower case.
var eksAllowedParams = map[string]bool{
	"action": true, "version": true, "x-amz-algorithm": true, "x-amz-credential": true, "x-amz-date": true,
	"x-amz-expires": true, "x-amz-security-token": true, "x-amz-signature": true, "x-amz-signedheaders": true,
}

var assumedRole = regexp.MustCompile(`^arn:aws:sts::(\d{12}):assumed-role/([^/]+)/(.+)$`)

func (h *EKSWebhook) review(tok string) (string, []string, error) {
	user, groups, unmapped, err := h.check(tok)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.counts.accepted++
	case unmapped:
		h.counts.unmapped++
		h.counts.rejected++
	default:
		h.counts.rejected++
	}
	return user, groups, err
}

func (h *EKSWebhook) check(tok string) (user string, groups []string, unmapped bool, err error) {
	if !strings.HasPrefix(tok, EKSTokenPrefix) {
		return "", nil, false, fmt.Errorf("not a k8s-aws-v1 token")
	}
	raw, err := b64url.DecodeString(strings.TrimPrefix(tok, EKSTokenPrefix))
	if err != nil {
		return "", nil, false, fmt.Errorf("token: not base64url")
	}
	u, err := url.Parse(string(raw))
	if err != nil {
		return "", nil, false, fmt.Errorf("token: not a URL")
	}
	hosts := []string{"sts.amazonaws.com", "sts." + h.Region + ".amazonaws.com"}
	if u.Scheme != "https" || !slices.Contains(hosts, u.Host) || u.Path != "/" {
		return "", nil, false, fmt.Errorf("token: URL %s://%s%s is not STS of %s", u.Scheme, u.Host, u.Path, h.Region)
	}
	q := u.Query()
	for k := range q {
		if !eksAllowedParams[strings.ToLower(k)] {
			return "", nil, false, fmt.Errorf("token: parameter %q not allowed", k)
		}
	}
	if q.Get("Action") != "GetCallerIdentity" || q.Get("Version") != "2011-06-15" || q.Get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" {
		return "", nil, false, fmt.Errorf("token: not a SigV4 GetCallerIdentity")
	}
	signed := strings.Split(q.Get("X-Amz-SignedHeaders"), ";")
	if !slices.Contains(signed, "x-k8s-aws-id") {
		return "", nil, false, fmt.Errorf("token: x-k8s-aws-id is not signed")
	}
	date, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil || time.Since(date) > 15*time.Minute || time.Until(date) > time.Minute {
		return "", nil, false, fmt.Errorf("token: X-Amz-Date %q outside 15 minutes", q.Get("X-Amz-Date"))
	}
	cluster, err := h.verifySignature(u, signed)
	if err != nil {
		return "", nil, false, err
	}
	arn, err := h.callerIdentity(q, cluster)
	if err != nil {
		return "", nil, false, err
	}
	m := assumedRole.FindStringSubmatch(arn)
	if m == nil {
		return "", nil, false, fmt.Errorf("STS answered %s, not an assumed role", arn)
	}
	role := fmt.Sprintf("arn:aws:iam::%s:role/%s", m[1], m[2])
	h.mu.Lock()
	entry, ok := h.entries[role]
	h.seen[cluster] = true
	h.mu.Unlock()
	if !ok {
		return "", nil, true, fmt.Errorf("ARN is not mapped: %s", role)
	}
	return fmt.Sprintf("arn:aws:sts::%s:assumed-role/%s/%s", m[1], m[2], m[3]), entry.Groups, false, nil
}

// verifySignature recomputes the presigned URL's SigV4 signature with the session's secret
// (from moto's state) for each cluster name the worker answers to, and returns the one it
// was signed for.
func (h *EKSWebhook) verifySignature(u *url.URL, signed []string) (string, error) {
	q := u.Query()
	cred := strings.Split(q.Get("X-Amz-Credential"), "/")
	if len(cred) != 5 || cred[3] != "sts" || cred[4] != "aws4_request" {
		return "", fmt.Errorf("token: credential scope %q", q.Get("X-Amz-Credential"))
	}
	sessions, err := h.moto.sessions()
	if err != nil {
		return "", fmt.Errorf("STS unreachable: %w", err)
	}
	var secret string
	for _, s := range sessions {
		if s.AccessKeyID == cred[0] && s.SessionToken == q.Get("X-Amz-Security-Token") {
			secret = s.SecretAccessKey
		}
	}
	if secret == "" {
		return "", fmt.Errorf("InvalidClientTokenId: the security token included in the request is invalid")
	}
	cq := sigv4Query(q)
	key := []byte("AWS4" + secret)
	for _, part := range []string{cred[1], cred[2], "sts", "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	empty := sha256.Sum256(nil)
	for _, cluster := range h.Clusters {
		headers := map[string]string{"host": u.Host, "x-k8s-aws-id": cluster}
		var ch strings.Builder
		for _, name := range signed {
			fmt.Fprintf(&ch, "%s:%s\n", name, headers[name])
		}
		for _, payload := range []string{hex.EncodeToString(empty[:]), "UNSIGNED-PAYLOAD"} {
			creq := strings.Join([]string{"GET", "/", cq, ch.String(), strings.Join(signed, ";"), payload}, "\n")
			sum := sha256.Sum256([]byte(creq))
			sts := strings.Join([]string{"AWS4-HMAC-SHA256", q.Get("X-Amz-Date"), strings.Join(cred[1:], "/"), hex.EncodeToString(sum[:])}, "\n")
			if hmac.Equal([]byte(hex.EncodeToString(hmacSHA256(key, sts))), []byte(q.Get("X-Amz-Signature"))) {
				return cluster, nil
			}
		}
	}
	return "", fmt.Errorf("SignatureDoesNotMatch: not signed for any of this cluster's names")
}

// sigv4Query is SigV4's canonical query string: every parameter but the signature, encoded,
// sorted by name.
func sigv4Query(q url.Values) string {
	var keys []string
	for k := range q {
		if k != "X-Amz-Signature" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var cq []string
	for _, k := range keys {
		cq = append(cq, sigv4Escape(k)+"="+sigv4Escape(q.Get(k)))
	}
	return strings.Join(cq, "&")
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// sigv4Escape is SigV4's URI encoding: all but A–Z a–z 0–9 - _ . ~ as %XX.
func sigv4Escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// callerIdentity replays the GetCallerIdentity call against moto, with the x-k8s-aws-id
// header, and returns the caller's ARN. moto reads the key id from an Authorization header
// only (not from a presigned query), so it gets the token's credential scope that way.
func (h *EKSWebhook) callerIdentity(q url.Values, cluster string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, h.moto.URL+"/?Action=GetCallerIdentity&Version=2011-06-15", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("x-k8s-aws-id", cluster)
	req.Header.Set("Authorization", fmt.Sprintf("AWS4-HMAC-SHA256 Credential=%s, SignedHeaders=%s, Signature=%s",
		q.Get("X-Amz-Credential"), q.Get("X-Amz-SignedHeaders"), q.Get("X-Amz-Signature")))
	resp, err := h.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("STS unreachable: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("STS GetCallerIdentity: %s", resp.Status)
	}
	m := regexp.MustCompile(`<Arn>([^<]+)</Arn>`).FindSubmatch(body)
	if m == nil {
		return "", fmt.Errorf("no Arn in STS's answer")
	}
	return string(m[1]), nil
}
