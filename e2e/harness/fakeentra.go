package harness

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// FakeEntra is Microsoft Entra ID as the azure provider's workload identity and an AKS
// cluster meet it, for one tenant and one application (the identity):
//
//   - GET /{tenant}/v2.0/.well-known/openid-configuration and /{tenant}/discovery/v2.0/keys:
//     the issuer's discovery document and its signing keys, which the AKS-like worker's
//     kube-apiserver fetches (its JWT authenticator);
//   - POST /{tenant}/oauth2/v2.0/token: the client-credentials grant with a federated client
//     assertion, checked as Entra checks a federated identity credential: the assertion is a
//     token of the hub's issuer (signature with the hub's JWKS, issuer, subject
//     system:serviceaccount:kueue-system:kueue-controller-manager, audience
//     api://AzureADTokenExchange, not expired), the client id and the scope
//     (<server app id>/.default). It answers an RS256 access token for the AKS server
//     application (aud = its id, oid = the identity's object id, 1 h), or, once the
//     application is disabled (SetEnabled), AADSTS7000112.
type FakeEntra struct {
	*FakeCloud
	Tenant, ClientID, ObjectID, ServerID string

	hub *KeyIssuer
	key *rsa.PrivateKey
	mu  sync.Mutex
	off bool
	ok  int // tokens issued
	no  int // requests refused (disabled application)
}

// Azure's fixed audiences and names (docs/providers/azure.md).
const (
	// AKSServerApp is the AKS AAD server application every AKS-managed Entra ID cluster accepts.
	AKSServerApp = "6dae42f8-4368-4678-94ff-3960e28e3630"
	// AzureExchangeAudience is the audience of the federated token Entra exchanges.
	AzureExchangeAudience = "api://AzureADTokenExchange"
	entraKid              = "e2e-entra-1"
	jwtBearerAssertion    = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
	// entraTokenLife is how long Entra's access tokens live (60–90 min; the low end).
	entraTokenLife = time.Hour
)

// StartFakeEntra serves the tenant's endpoints; it federates with hub's issuer.
func StartFakeEntra(ctx context.Context, dir string, hub *Cluster, tenant, clientID, objectID string) (*FakeEntra, error) {
	iss, err := LoadIssuer(ctx, hub)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	fc, err := StartFakeCloud(dir, "login.microsoftonline.com")
	if err != nil {
		return nil, err
	}
	e := &FakeEntra{FakeCloud: fc, Tenant: tenant, ClientID: clientID, ObjectID: objectID, ServerID: AKSServerApp, hub: iss, key: key}
	fc.Mux.HandleFunc("GET /"+tenant+"/v2.0/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"issuer": e.Issuer(), "jwks_uri": e.URL + "/" + tenant + "/discovery/v2.0/keys",
			"token_endpoint": e.URL + "/" + tenant + "/oauth2/v2.0/token", "id_token_signing_alg_values_supported": []string{"RS256"},
			"response_types_supported": []string{"code", "id_token", "token id_token"}, "subject_types_supported": []string{"pairwise"},
		})
	})
	fc.Mux.HandleFunc("GET /"+tenant+"/discovery/v2.0/keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"keys": []any{rsaJWK(entraKid, &key.PublicKey)}})
	})
	fc.Mux.HandleFunc("POST /"+tenant+"/oauth2/v2.0/token", e.token)
	return e, nil
}

// TokenPrefix begins every access token the fake issues (its JWS header): a log holding it
// holds a token.
func (e *FakeEntra) TokenPrefix() string {
	h, _ := json.Marshal(map[string]any{"alg": "RS256", "typ": "JWT", "kid": entraKid})
	return b64url.EncodeToString(h) + "."
}

// Issuer is the tenant's v2.0 issuer, what AKS's authenticator trusts.
func (e *FakeEntra) Issuer() string { return e.URL + "/" + e.Tenant + "/v2.0" }

// SetEnabled enables or disables the application (an operator disabling the service
// principal): a disabled one gets AADSTS7000112 for every token request.
func (e *FakeEntra) SetEnabled(on bool) { e.mu.Lock(); e.off = !on; e.mu.Unlock() }

// TokenRequests are the tokens issued and the requests refused because the application was
// disabled.
func (e *FakeEntra) TokenRequests() (issued, refused int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ok, e.no
}

func (e *FakeEntra) token(w http.ResponseWriter, r *http.Request) {
	aadError := func(status int, code, desc string) {
		writeJSON(w, status, map[string]any{"error": code, "error_description": desc})
	}
	if err := r.ParseForm(); err != nil {
		aadError(http.StatusBadRequest, "invalid_request", e.violation("AADSTS900144: unreadable form"))
		return
	}
	f := r.PostForm.Get
	switch {
	case f("grant_type") != "client_credentials":
		aadError(http.StatusBadRequest, "unsupported_grant_type", e.violation("grant_type %q", f("grant_type")))
		return
	case f("client_id") != e.ClientID:
		aadError(http.StatusBadRequest, "unauthorized_client", e.violation("AADSTS700016: application %q not found in the directory", f("client_id")))
		return
	case f("client_assertion_type") != jwtBearerAssertion:
		aadError(http.StatusBadRequest, "invalid_request", e.violation("client_assertion_type %q", f("client_assertion_type")))
		return
	case f("scope") != e.ServerID+"/.default":
		aadError(http.StatusBadRequest, "invalid_scope", e.violation("AADSTS70011: scope %q", f("scope")))
		return
	}
	if _, err := e.hub.Verify(f("client_assertion"), AzureExchangeAudience, KueueSubject); err != nil {
		aadError(http.StatusBadRequest, "invalid_client", e.violation("AADSTS700213: no matching federated identity record: %v", err))
		return
	}
	e.mu.Lock()
	if e.off {
		e.no++
		e.mu.Unlock()
		aadError(http.StatusBadRequest, "unauthorized_client", fmt.Sprintf("AADSTS7000112: Application '%s' is disabled.", e.ClientID))
		return
	}
	e.ok++
	e.mu.Unlock()
	now := time.Now()
	tok, err := signRS256(e.key, entraKid, map[string]any{
		"aud": e.ServerID, "iss": e.Issuer(), "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(entraTokenLife).Unix(),
		"sub": e.ObjectID, "oid": e.ObjectID, "tid": e.Tenant, "azp": e.ClientID, "appid": e.ClientID,
		"idtyp": "app", "ver": "2.0",
	})
	if err != nil {
		aadError(http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"token_type": "Bearer", "expires_in": int(entraTokenLife.Seconds()) - 1, "ext_expires_in": int(entraTokenLife.Seconds()) - 1, "access_token": tok})
}

// AuthenticationConfig is the AKS-like worker's kube-apiserver --authentication-config: one
// JWT authenticator trusting the tenant's issuer (discovery and keys over HTTPS with the
// fake's CA), the AKS server application as audience, the tenant checked, and the user the
// token's object id (what AKS names an Entra identity: bind it as a User, docs/deploy.md).
// refused adds the rule an operator adds to stop a disabled identity whose tokens are still
// unexpired: kube-apiserver then refuses them (401).
func (e *FakeEntra) AuthenticationConfig(refused bool) string {
	var ca strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(string(e.CAPEM)), "\n") {
		ca.WriteString("        " + l + "\n")
	}
	rules := fmt.Sprintf("  - {expression: \"claims.tid == '%s'\", message: \"not the tenant's token\"}\n", e.Tenant)
	if refused {
		rules += fmt.Sprintf("  - {expression: \"claims.oid != '%s'\", message: \"identity disabled by the operator\"}\n", e.ObjectID)
	}
	return fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: %s
    audiences: [%s]
    certificateAuthority: |
%s  claimValidationRules:
%s  claimMappings:
    username: {claim: oid, prefix: ""}
`, e.Issuer(), e.ServerID, ca.String(), rules)
}

// WriteAuthenticationConfig writes AuthenticationConfig(refused) to path in place (kube-apiserver
// watches the file and reloads it).
func (e *FakeEntra) WriteAuthenticationConfig(path string, refused bool) error {
	return os.WriteFile(path, []byte(e.AuthenticationConfig(refused)), 0o600)
}
