package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// presignForTest signs a GetCallerIdentity URL as botocore and the broker do (the empty
// body's hash), for cluster's x-k8s-aws-id.
func presignForTest(host, akid, secret, session, cluster string, at time.Time) string {
	date := at.UTC().Format("20060102T150405Z")
	scope := at.UTC().Format("20060102") + "/us-west-2/sts/aws4_request"
	q := url.Values{"Action": {"GetCallerIdentity"}, "Version": {"2011-06-15"}, "X-Amz-Algorithm": {"AWS4-HMAC-SHA256"},
		"X-Amz-Credential": {akid + "/" + scope}, "X-Amz-Date": {date}, "X-Amz-Expires": {"60"},
		"X-Amz-SignedHeaders": {"host;x-k8s-aws-id"}, "X-Amz-Security-Token": {session}}
	cq := sigv4Query(q)
	empty := sha256.Sum256(nil)
	creq := "GET\n/\n" + cq + "\nhost:" + host + "\nx-k8s-aws-id:" + cluster + "\n\nhost;x-k8s-aws-id\n" + hex.EncodeToString(empty[:])
	sum := sha256.Sum256([]byte(creq))
	key := []byte("AWS4" + secret)
	for _, p := range strings.Split(scope, "/") {
		key = hmacSHA256(key, p)
	}
	sig := hex.EncodeToString(hmacSHA256(key, "AWS4-HMAC-SHA256\n"+date+"\n"+scope+"\n"+hex.EncodeToString(sum[:])))
	return "https://" + host + "/?" + cq + "&X-Amz-Signature=" + sig
}

// The EKS-like webhook accepts only a token signed with a session STS issued, for one of its
// cluster names, within 15 minutes, of a role with an access entry.
func TestEKSWebhookChecks(t *testing.T) {
	const akid, secret, session = "ASIAEXAMPLE", "c2VjcmV0", "FQoG+session/token="
	sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moto-api/data.json" {
			fmt.Fprintf(w, `{"sts":{"AssumedRole":[{"access_key_id":%q,"secret_access_key":%q,"session_token":%q}]}}`, akid, secret, session)
			return
		}
		if r.URL.Query().Get("Action") != "GetCallerIdentity" || !strings.Contains(r.Header.Get("Authorization"), akid) {
			http.Error(w, "bad", http.StatusForbidden)
			return
		}
		fmt.Fprint(w, "<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>arn:aws:sts::123456789012:assumed-role/kueue/s1</Arn></GetCallerIdentityResult></GetCallerIdentityResponse>")
	}))
	defer sts.Close()
	h := &EKSWebhook{Region: "us-west-2", Clusters: []string{"eks-1", "eks-2"}, moto: &Moto{URL: sts.URL}, client: sts.Client(),
		entries: map[string]AccessEntry{}, seen: map[string]bool{}}
	h.SetAccessEntry("arn:aws:iam::123456789012:role/kueue", []string{"kueue-multikueue"})
	token := func(u string) string { return EKSTokenPrefix + b64url.EncodeToString([]byte(u)) }
	host := "sts.us-west-2.amazonaws.com"
	now := time.Now()

	user, groups, _, err := h.check(token(presignForTest(host, akid, secret, session, "eks-2", now)))
	if err != nil || user != "arn:aws:sts::123456789012:assumed-role/kueue/s1" || len(groups) != 1 {
		t.Fatalf("a good token: user %q groups %v err %v", user, groups, err)
	}
	for what, u := range map[string]string{
		"another cluster's name": presignForTest(host, akid, secret, session, "eks-3", now),
		"another secret":         presignForTest(host, akid, "other", session, "eks-1", now),
		"another host":           presignForTest("sts.example.com", akid, secret, session, "eks-1", now),
		"16 minutes old":         presignForTest(host, akid, secret, session, "eks-1", now.Add(-16*time.Minute)),
		"an extra parameter":     presignForTest(host, akid, secret, session, "eks-1", now) + "&Foo=bar",
	} {
		if _, _, _, err := h.check(token(u)); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	h.SetAccessEntry("arn:aws:iam::123456789012:role/kueue", nil)
	if _, _, unmapped, err := h.check(token(presignForTest(host, akid, secret, session, "eks-1", now))); err == nil || !unmapped {
		t.Errorf("without its access entry: err %v unmapped %v", err, unmapped)
	}
}
