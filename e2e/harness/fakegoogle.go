package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Google's scopes and token types as the gcp provider uses them (docs/providers/gcp.md).
const (
	ScopeCloudPlatform = "https://www.googleapis.com/auth/cloud-platform"
	ScopeUserinfoEmail = "https://www.googleapis.com/auth/userinfo.email"
	scopeIAM           = "https://www.googleapis.com/auth/iam"
	tokenExchangeGrant = "urn:ietf:params:oauth:grant-type:token-exchange"
	jwtTokenType       = "urn:ietf:params:oauth:token-type:jwt"
	accessTokenType    = "urn:ietf:params:oauth:token-type:access_token"
	// googleTokenLife is how long Google's access tokens live (1 h).
	googleTokenLife = time.Hour
	// GoogleTokenPrefix begins every access token the fake mints (as Google's OAuth2 access
	// tokens begin): a log holding it holds a token.
	GoogleTokenPrefix = "ya29."
	// metadataTokenPath is the GCE/GKE metadata server's token of the pod's identity.
	metadataTokenPath = "/computeMetadata/v1/instance/service-accounts/default/token"
)

// FakeGoogle is Google as the gcp provider and a GKE cluster meet it, for one Google service
// account (the identity):
//
//   - the metadata server (plain HTTP, GCE_METADATA_HOST = Metadata): GKE Workload Identity's
//     token of the service account the pod's ServiceAccount is tied to (deploy/examples/
//     identity/gke-workload-identity), `Metadata-Flavor: Google` and the scopes checked;
//   - STS (POST /v1/token): RFC 8693's exchange of the hub pod's projected token (checked as a
//     workload identity pool provider checks it: signature with the hub's JWKS, issuer,
//     audience = the pool provider, subject = Kueue's ServiceAccount) for a federated token;
//   - IAM Credentials (POST /v1/projects/-/serviceAccounts/EMAIL:generateAccessToken): the
//     federated token (roles/iam.workloadIdentityUser on the account) buys the account's
//     access token, with the scopes and lifetime checked;
//   - tokeninfo (GET /tokeninfo?access_token=): what a token is (email, scopes, expiry);
//   - the GKE-like worker's token webhook (POST /gke/authenticate): the token checked with
//     tokeninfo, over HTTPS, and mapped to the account's email (what GKE names a Google
//     service account: bind it as a User, docs/deploy.md).
//
// Disabling the account (SetEnabled) makes every token of it minted so far invalid at
// tokeninfo, for good, and every new token refused until it is enabled again.
type FakeGoogle struct {
	*FakeCloud
	// Metadata is the metadata server's host:port (GCE_METADATA_HOST).
	Metadata string
	// Account is the Google service account's email; Audience the workload identity pool
	// provider STS accepts the hub's tokens for.
	Account, Audience string

	hub      *KeyIssuer
	metadata *http.Server
	mu       sync.Mutex
	off      bool
	tokens   map[string]googleToken // fingerprint → what tokeninfo says
	counts   GoogleCounts
}

type googleToken struct {
	email   string // "" for a federated (STS) token: not an access token of an account
	scopes  []string
	expires time.Time
	revoked bool // minted before the account was disabled
}

// GoogleCounts are the requests each endpoint served: tokens minted by the metadata server,
// STS exchanges, impersonations (generateAccessToken), refusals of a disabled account, and
// TokenReviews the webhook accepted and refused.
type GoogleCounts struct {
	Metadata, STS, Impersonations, Refused, Accepted, Rejected int
}

// StartFakeGoogle serves Google's endpoints for account; STS federates with hub's issuer for
// audience.
func StartFakeGoogle(ctx context.Context, dir string, hub *Cluster, account, audience string) (*FakeGoogle, error) {
	iss, err := LoadIssuer(ctx, hub)
	if err != nil {
		return nil, err
	}
	fc, err := StartFakeCloud(dir, "googleapis.com")
	if err != nil {
		return nil, err
	}
	g := &FakeGoogle{FakeCloud: fc, Account: account, Audience: audience, hub: iss, tokens: map[string]googleToken{}}
	md := http.NewServeMux()
	md.HandleFunc("GET "+metadataTokenPath, g.metadataToken)
	if g.metadata, g.Metadata, err = listenPlain(md); err != nil {
		fc.Close()
		return nil, err
	}
	fc.Mux.HandleFunc("POST /v1/token", g.sts)
	fc.Mux.HandleFunc("POST /v1/projects/-/serviceAccounts/{target}", g.generateAccessToken)
	fc.Mux.HandleFunc("GET /tokeninfo", g.tokeninfo)
	fc.Mux.HandleFunc("POST /gke/authenticate", serveTokenReview(g.review))
	return g, nil
}

// Close stops both servers.
func (g *FakeGoogle) Close() {
	if g.metadata != nil {
		_ = g.metadata.Close()
	}
	g.FakeCloud.Close()
}

// SetEnabled enables or disables the service account. Disabling it also revokes every token
// of it minted so far: they stay invalid once it is enabled again, so a client recovers only
// with a new token.
func (g *FakeGoogle) SetEnabled(on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.off = !on
	if on {
		return
	}
	for k, t := range g.tokens {
		if t.email == g.Account {
			t.revoked = true
			g.tokens[k] = t
		}
	}
}

// Counts are the requests served so far.
func (g *FakeGoogle) Counts() GoogleCounts { g.mu.Lock(); defer g.mu.Unlock(); return g.counts }

func googleError(w http.ResponseWriter, status int, code, desc string) {
	writeJSON(w, status, map[string]any{"error": code, "error_description": desc})
}

// mint records and returns a new access token of email (or a federated one) for scopes.
func (g *FakeGoogle) mint(prefix, email string, scopes []string) (string, time.Time) {
	tok := randomToken(prefix)
	exp := time.Now().Add(googleTokenLife)
	g.tokens[fingerprint(tok)] = googleToken{email: email, scopes: scopes, expires: exp}
	return tok, exp
}

func (g *FakeGoogle) metadataToken(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Metadata-Flavor", "Google")
	if r.Header.Get("Metadata-Flavor") != "Google" {
		googleError(w, http.StatusForbidden, "forbidden", g.violation("metadata request without Metadata-Flavor: Google"))
		return
	}
	want := ScopeCloudPlatform + "," + ScopeUserinfoEmail
	if s := r.URL.Query().Get("scopes"); s != want {
		googleError(w, http.StatusBadRequest, "invalid_scope", g.violation("metadata scopes %q, want the shipped config's %q", s, want))
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off {
		g.counts.Refused++
		googleError(w, http.StatusForbidden, "access_denied", fmt.Sprintf("service account %s is disabled", g.Account))
		return
	}
	g.counts.Metadata++
	tok, _ := g.mint(GoogleTokenPrefix+"md-", g.Account, strings.Split(want, ","))
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "expires_in": int(googleTokenLife.Seconds()) - 1, "token_type": "Bearer"})
}

func (g *FakeGoogle) sts(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		googleError(w, http.StatusBadRequest, "invalid_request", g.violation("unreadable form"))
		return
	}
	f := r.PostForm.Get
	switch {
	case f("grant_type") != tokenExchangeGrant:
		googleError(w, http.StatusBadRequest, "unsupported_grant_type", g.violation("grant_type %q", f("grant_type")))
		return
	case f("audience") != g.Audience:
		googleError(w, http.StatusBadRequest, "invalid_target", g.violation("audience %q", f("audience")))
		return
	case f("subject_token_type") != jwtTokenType || f("requested_token_type") != accessTokenType:
		googleError(w, http.StatusBadRequest, "invalid_request", g.violation("token types %q -> %q", f("subject_token_type"), f("requested_token_type")))
		return
	case f("scope") != scopeIAM && f("scope") != ScopeCloudPlatform:
		googleError(w, http.StatusBadRequest, "invalid_scope", g.violation("scope %q", f("scope")))
		return
	}
	if _, err := g.hub.Verify(f("subject_token"), g.Audience, KueueSubject); err != nil {
		googleError(w, http.StatusBadRequest, "invalid_grant", g.violation("subject token: %v", err))
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.counts.STS++
	tok, _ := g.mint(GoogleTokenPrefix+"fed-", "", []string{f("scope")})
	writeJSON(w, http.StatusOK, map[string]any{"access_token": tok, "issued_token_type": accessTokenType, "token_type": "Bearer", "expires_in": int(googleTokenLife.Seconds())})
}

func (g *FakeGoogle) generateAccessToken(w http.ResponseWriter, r *http.Request) {
	target := r.PathValue("target")
	iamError := func(status int, msg string) {
		writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg}})
	}
	if target != g.Account+":generateAccessToken" {
		iamError(http.StatusNotFound, g.violation("generateAccessToken for %q, not %s", target, g.Account))
		return
	}
	var body struct {
		Scope     []string `json:"scope"`
		Lifetime  string   `json:"lifetime"`
		Delegates []string `json:"delegates"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		iamError(http.StatusBadRequest, g.violation("unreadable body"))
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	caller, ok := g.tokens[fingerprint(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))]
	switch {
	case !ok || caller.email != "" || time.Now().After(caller.expires):
		iamError(http.StatusUnauthorized, g.violation("the caller's bearer is not a federated token STS issued"))
		return
	case !slices.Equal(body.Scope, []string{ScopeCloudPlatform, ScopeUserinfoEmail}) || body.Lifetime != "3600s":
		iamError(http.StatusBadRequest, g.violation("scope %v lifetime %q", body.Scope, body.Lifetime))
		return
	case g.off:
		g.counts.Refused++
		iamError(http.StatusForbidden, fmt.Sprintf("Service account %s is disabled.", g.Account))
		return
	}
	g.counts.Impersonations++
	tok, exp := g.mint(GoogleTokenPrefix+"imp-", g.Account, body.Scope)
	writeJSON(w, http.StatusOK, map[string]any{"accessToken": tok, "expireTime": exp.UTC().Format(time.RFC3339)})
}

// tokeninfo answers as https://oauth2.googleapis.com/tokeninfo does: the token's account and
// scopes, or 400 invalid_token (unknown, expired, or of a disabled account).
func (g *FakeGoogle) tokeninfo(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	t, ok := g.tokens[fingerprint(r.URL.Query().Get("access_token"))]
	off := g.off
	g.mu.Unlock()
	if !ok || t.revoked || time.Now().After(t.expires) || (off && t.email == g.Account) {
		googleError(w, http.StatusBadRequest, "invalid_token", "Invalid Value")
		return
	}
	info := map[string]any{"scope": strings.Join(t.scopes, " "), "exp": fmt.Sprint(t.expires.Unix()),
		"expires_in": fmt.Sprint(int(time.Until(t.expires).Seconds()))}
	if t.email != "" {
		info["email"], info["email_verified"] = t.email, "true"
	}
	writeJSON(w, http.StatusOK, info)
}

// review is the GKE-like worker's check of a bearer token: tokeninfo over HTTPS, a verified
// email and the userinfo.email scope (GKE maps a Google token to its email); the user is the
// email.
func (g *FakeGoogle) review(tok string) (string, []string, error) {
	err := func() error {
		req, err := http.NewRequest(http.MethodGet, g.URL+"/tokeninfo", nil)
		if err != nil {
			return err
		}
		q := req.URL.Query()
		q.Set("access_token", tok)
		req.URL.RawQuery = q.Encode()
		resp, err := g.Client().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var info struct {
			Email         string `json:"email"`
			EmailVerified string `json:"email_verified"`
			Scope         string `json:"scope"`
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("tokeninfo: %s", resp.Status)
		}
		if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
			return err
		}
		if info.Email == "" || info.EmailVerified != "true" || !slices.Contains(strings.Fields(info.Scope), ScopeUserinfoEmail) {
			return fmt.Errorf("the token carries no verified email (scopes %q)", info.Scope)
		}
		tok = info.Email
		return nil
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.counts.Rejected++
		return "", nil, err
	}
	g.counts.Accepted++
	return tok, nil, nil
}
