//! Entra ID's `AADSTS<code>` errors: the ones a controller's identity runs into, each with a
//! one-line meaning that says what to fix (from Microsoft's "Microsoft Entra authentication
//! and authorization error codes" reference).

/// (code, meaning). Kept to what a non-interactive client-credentials or federated flow for
/// an AKS server application can hit.
const MEANINGS: &[(u64, &str)] = &[
    (
        50020,
        "the identity is not from a tenant that may sign in to this tenant",
    ),
    (
        53003,
        "blocked by a Conditional Access policy in the tenant",
    ),
    (
        65001,
        "the application has not been granted consent to access the AKS server application",
    ),
    (70011, "the requested scope is invalid; check serverId"),
    (
        90002,
        "the tenant was not found; check tenantId (and the authority host for sovereign clouds)",
    ),
    (90014, "a required field is missing from the token request"),
    (
        500011,
        "the resource (serverId) was not found in the tenant; check serverId and that the cluster's tenant has it",
    ),
    (
        700016,
        "the application (client id) was not found in the tenant; check clientId and tenantId",
    ),
    (
        700024,
        "the client assertion is outside its validity time; the federated token has expired (is kubelet still rotating it?)",
    ),
    (
        700027,
        "the client assertion's signature is invalid; the certificate is not registered on the application",
    ),
    (
        700211,
        "no federated credential on the application matches the token's issuer; check the cluster's OIDC issuer URL in the federated credential",
    ),
    (
        700212,
        "no federated credential on the application matches the token's audience (api://AzureADTokenExchange)",
    ),
    (
        700213,
        "no federated credential on the application matches the token's subject; check system:serviceaccount:<namespace>:<name>",
    ),
    (
        700023,
        "the client assertion's issuer is not allowed for this application",
    ),
    (7000112, "the application is disabled"),
    (
        7000215,
        "invalid client secret; use the secret's value, not its id",
    ),
    (7000222, "the client secret has expired; create a new one"),
    (
        900023,
        "the tenant id is neither a valid GUID nor a verified domain",
    ),
    (900971, "no reply address is registered for the application"),
];

/// The meaning of a code, if it is one we know.
pub fn meaning(code: u64) -> Option<&'static str> {
    MEANINGS.iter().find(|(c, _)| *c == code).map(|(_, m)| *m)
}

/// The first `AADSTS<digits>` in `text`: its code and where the text after it starts.
pub fn find_code(text: &str) -> Option<(u64, usize)> {
    let mut rest = text;
    let mut offset = 0;
    while let Some(at) = rest.find("AADSTS") {
        let digits: String = rest[at + 6..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(code) = digits.parse() {
            return Some((code, offset + at + 6 + digits.len()));
        }
        offset += at + 6;
        rest = &rest[at + 6..];
    }
    None
}

/// `AADSTS<code> (<meaning>): <Entra's first sentence>` on one line, without the trace and
/// correlation ids Entra appends.
pub fn describe(code: u64, description: &str) -> String {
    let text = super::one_line(description);
    // Entra writes "AADSTS700016: Application with identifier ... Trace ID: ... Timestamp: ...".
    let own = match find_code(&text) {
        Some((c, end)) if c == code => text[end..].trim_start_matches([':', ' ']).to_owned(),
        _ => text,
    };
    let own = own
        .split(" Trace ID:")
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    let head = match meaning(code) {
        Some(m) => format!("AADSTS{code} ({m})"),
        None => format!("AADSTS{code}"),
    };
    if own.is_empty() {
        head
    } else {
        format!("{head}: {}", super::shorten(&own))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_found_and_described() {
        let text = "AADSTS700016: Application with identifier 'abc' was not found in the directory 'x'.\r\nTrace ID: 1 Correlation ID: 2 Timestamp: 3";
        assert_eq!(find_code(text).map(|(c, _)| c), Some(700016));
        assert_eq!(
            describe(700016, text),
            "AADSTS700016 (the application (client id) was not found in the tenant; check clientId and tenantId): Application with identifier 'abc' was not found in the directory 'x'."
        );
        assert_eq!(
            find_code("ERROR: AADSTS not a code, AADSTS50020: x").map(|(c, _)| c),
            Some(50020)
        );
        assert_eq!(find_code("no code here"), None);
        assert_eq!(describe(123, ""), "AADSTS123");
        assert!(meaning(7000215).is_some());
        // Every entry is one line.
        assert!(MEANINGS.iter().all(|(_, m)| !m.contains('\n')));
    }
}
