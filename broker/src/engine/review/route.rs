//! Where client-go sends a request for a kubeconfig cluster, rule for rule, so the re-ask
//! check reaches the server (and the proxy) client-go reaches and nothing else:
//!
//! - **The URL**: the server string as Go's `net/url` reads it (`url.Parse`: scheme, the
//!   authority up to the first `/`, the last `@` ending the userinfo, percent-escapes
//!   decoded), and the request path built as client-go's `rest` package builds it: the
//!   server's path is a prefix, `path.Join("/", prefix, "/apis/…")` (`DefaultServerURL`,
//!   `Request.URL`), then escaped as Go escapes a path. A path never names a host, whatever
//!   slashes it holds: `https://h:1//other:2/` asks `h:1` for `/other:2/apis/…`.
//! - **The proxy**: the cluster's `proxy-url` for every server, loopback included
//!   (client-go's `http.ProxyURL`); else the environment as Go's
//!   `golang.org/x/net/http/httpproxy` reads it (`FromEnvironment`, `useProxy`) behind
//!   client-go's `NewProxierWithNoProxyCIDR`.
//! - **Userinfo**: `https://user:pass@host` makes Go's `http.Client` send `Authorization:
//!   Basic`, and client-go's token round-tripper then adds no bearer token.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Go's `net/http` default port for a scheme (`schemePort`; httpproxy's `portMap`).
fn default_port(scheme: &str) -> &'static str {
    match scheme {
        "http" => "80",
        "https" => "443",
        "socks5" | "socks5h" => "1080",
        _ => "",
    }
}

/// A URL as Go's `url.Parse` splits it: the parts a route and a request need.
#[derive(Clone, PartialEq, Eq)]
pub struct GoUrl {
    /// Lower case.
    pub scheme: String,
    /// Decoded user name and, when the userinfo has a `:`, password.
    pub user: Option<(String, Option<String>)>,
    /// `host[:port]` as written (`[v6]` keeps its brackets), decoded.
    pub host: String,
    /// The path, decoded.
    pub path: String,
}

impl std::fmt::Debug for GoUrl {
    /// Never the userinfo: it may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoUrl")
            .field("scheme", &self.scheme)
            .field("user", &self.user.as_ref().map(|_| "[redacted]"))
            .field("host", &self.host)
            .field("path", &self.path)
            .finish()
    }
}

impl GoUrl {
    /// `url.Parse`, for URLs with an authority (`scheme://…`); anything else is an error
    /// here (client-go would read a server without `//` as something else again, and an
    /// exec plugin only ever runs for `https://` servers). Errors name the part, never
    /// the userinfo.
    pub fn parse(raw: &str) -> Result<GoUrl, String> {
        if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err("it holds a control character".to_owned());
        }
        let raw = raw.split_once('#').map_or(raw, |(u, _)| u);
        let (scheme, rest) = scheme_of(raw).ok_or("it has no scheme")?;
        let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
        let rest = rest
            .strip_prefix("//")
            .ok_or("it has no //host after the scheme")?;
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        let (user, host) = match authority.rfind('@') {
            None => (None, authority),
            Some(i) => (Some(parse_userinfo(&authority[..i])?), &authority[i + 1..]),
        };
        Ok(GoUrl {
            scheme: scheme.to_ascii_lowercase(),
            user,
            host: parse_host(host)?,
            path: unescape(path).ok_or("its path has an invalid %-escape")?,
        })
    }

    /// `URL.Hostname()`: the host without port and brackets.
    pub fn hostname(&self) -> &str {
        let host = match self.host.rfind(':') {
            Some(i) if valid_port(&self.host[i..]) => &self.host[..i],
            _ => &self.host,
        };
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// `URL.Port()`: empty when none is written.
    pub fn port(&self) -> &str {
        match self.host.rfind(':') {
            Some(i) if valid_port(&self.host[i..]) => &self.host[i + 1..],
            _ => "",
        }
    }

    /// The host name as Go dials and matches it: IDNA to ASCII when it is not ASCII.
    pub fn ascii_hostname(&self) -> String {
        let host = self.hostname();
        if host.is_ascii() {
            return host.to_owned();
        }
        reqwest::Url::parse(&format!("http://{host}/"))
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| host.to_owned())
    }

    /// The port Go dials: the written one, else the scheme's.
    pub fn dial_port(&self) -> &str {
        match self.port() {
            "" => default_port(&self.scheme),
            p => p,
        }
    }

    /// Go's `canonicalAddr`: `host:port` with the port always there, `[v6]` bracketed.
    /// A proxy's CONNECT names this; so does a SOCKS5 connect request.
    pub fn authority(&self) -> String {
        join_host_port(&self.ascii_hostname(), self.dial_port())
    }

    /// `Authorization` / `Proxy-Authorization` from the userinfo, as Go's `basicAuth`.
    pub fn basic_auth(&self) -> Option<String> {
        use base64::Engine as _;
        let (user, password) = self.user.as_ref()?;
        let pair = format!("{user}:{}", password.as_deref().unwrap_or(""));
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ))
    }
}

/// `net.JoinHostPort`.
fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `getScheme`: letters, then letters, digits, `+`, `-`, `.`, up to a `:`.
fn scheme_of(raw: &str) -> Option<(&str, &str)> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i > 0 => return Some((&raw[..i], &raw[i + 1..])),
            _ => return None,
        }
    }
    None
}

/// Go's `validOptionalPort`: empty, or `:` and digits.
fn valid_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `parseAuthority` for the userinfo: its characters, then the user and the password
/// (split at the first `:`) decoded.
fn parse_userinfo(info: &str) -> Result<(String, Option<String>), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c);
    let invalid = || "its userinfo is not valid".to_owned();
    if !info.chars().all(allowed) {
        return Err(invalid());
    }
    match info.split_once(':') {
        None => Ok((unescape(info).ok_or_else(invalid)?, None)),
        Some((user, password)) => Ok((
            unescape(user).ok_or_else(invalid)?,
            Some(unescape(password).ok_or_else(invalid)?),
        )),
    }
}

/// Go's `parseHost`, without the `%25` zones and escapes Go allows in a host (a server
/// that needs them is not checked: "not a URL").
fn parse_host(host: &str) -> Result<String, String> {
    let bad = |what: &str| Err(format!("its host {what}"));
    if let Some(inner) = host.strip_prefix('[') {
        let Some(end) = inner.rfind(']') else {
            return bad("misses a ']'");
        };
        if !valid_port(&inner[end + 1..]) {
            return bad("has an invalid port");
        }
        if inner[..end].parse::<Ipv6Addr>().is_err() {
            return bad("is not an IPv6 address in brackets");
        }
    } else if let Some(i) = host.rfind(':')
        && !valid_port(&host[i..])
    {
        return bad("has an invalid port");
    }
    let allowed = |c: char| {
        !c.is_ascii() || c.is_ascii_alphanumeric() || "-_.~!$&'()*+,;=:[]<>\"".contains(c)
    };
    if !host.chars().all(allowed) {
        return bad("holds a character a host name cannot have");
    }
    Ok(host.to_owned())
}

/// Percent-decoding; `None` for a `%` not followed by two hex digits (Go's error).
fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `path.Clean` of a rooted path.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Go's `escape(s, encodePath)`: what `URL.EscapedPath` sends for a path client-go set.
fn escape_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The path client-go sends for `api_path` (such as `/apis/authentication.k8s.io/v1/…`) on
/// `server`: `path.Join("/", server.Path, api_path)`, escaped.
pub fn request_path(server: &GoUrl, api_path: &str) -> String {
    escape_path(&clean(&format!("/{}/{api_path}", server.path)))
}

/// Go's `ip.IsLoopback()` on a host as `netip.ParseAddr` reads it: 127/8, `::1`, and
/// 127/8 written as an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`).
fn loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// An IP address written as a host, Go's `netip.ParseAddr` (a `%zone` is allowed on IPv6).
fn parse_ip(host: &str) -> Option<IpAddr> {
    let unzoned = match host.split_once('%') {
        Some((ip, zone)) if ip.contains(':') && !zone.is_empty() => ip,
        _ => host,
    };
    unzoned.parse().ok()
}

/// k8s.io/utils `ParseIPSloppy`: IPv4 parts may have leading zeros (read as decimal).
fn parse_ip_sloppy(host: &str) -> Option<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (octet, part) in octets.iter_mut().zip(&parts) {
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// An address block of `NO_PROXY`: `net.ParseCIDR` (`sloppy`: k8s.io/utils
/// `ParseCIDRSloppy`, leading zeros allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    fn parse(text: &str, sloppy: bool) -> Option<Cidr> {
        let (ip, bits) = text.split_once('/')?;
        let net = if sloppy {
            parse_ip_sloppy(ip)?
        } else {
            ip.parse().ok()?
        };
        let max = if net.is_ipv4() { 32 } else { 128 };
        if bits.is_empty() || bits.len() > 3 || !bits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let bits: u8 = bits.parse().ok()?;
        (bits <= max).then_some(Cidr { net, bits })
    }

    /// `IPNet.Contains`: an IPv4 block holds IPv4 addresses, IPv4-mapped ones included; an
    /// IPv6 block holds the other IPv6 addresses.
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// One `NO_PROXY` entry, as httpproxy's `config.init` sorts them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    Cidr(Cidr),
    Ip {
        ip: IpAddr,
        port: String,
    },
    /// `host` starts with a dot; `exact`: the entry had none, so the name itself matches.
    Domain {
        host: String,
        port: String,
        exact: bool,
    },
}

/// `NO_PROXY` read as Go's httpproxy reads it: `*` (everything), CIDRs, IPs with an optional
/// port, and names with an optional port (`example.com` is the name and its subdomains,
/// `.example.com` and `*.example.com` only the subdomains). Entries are lower-cased and
/// trimmed; malformed ones are skipped, as Go skips them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy {
    all: bool,
    rules: Vec<Rule>,
    /// client-go's `NewProxierWithNoProxyCIDR` in front of Go's rules: the CIDRs again, read
    /// sloppily, matched against a sloppily read IP host.
    sloppy_cidrs: Vec<Cidr>,
}

impl NoProxy {
    pub fn parse(list: &str) -> NoProxy {
        let mut no_proxy = NoProxy {
            sloppy_cidrs: list
                .split(',')
                .filter_map(|p| Cidr::parse(p, true))
                .collect(),
            ..NoProxy::default()
        };
        for entry in list.split(',') {
            let entry = entry.trim().to_ascii_lowercase();
            if entry.is_empty() {
                continue;
            }
            if entry == "*" {
                no_proxy.all = true;
                no_proxy.rules.clear();
                return no_proxy;
            }
            if let Some(cidr) = Cidr::parse(&entry, false) {
                no_proxy.rules.push(Rule::Cidr(cidr));
                continue;
            }
            let (host, port) = match split_host_port(&entry) {
                Some(("", _)) => continue,
                Some((host, port)) => (
                    host.strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host)
                        .to_owned(),
                    port.to_owned(),
                ),
                None => (entry.clone(), String::new()),
            };
            if let Some(ip) = parse_ip(&host).filter(|_| !host.contains('%')) {
                no_proxy.rules.push(Rule::Ip { ip, port });
                continue;
            }
            if host.is_empty() {
                continue;
            }
            let host = host
                .strip_prefix('*')
                .filter(|h| h.starts_with('.'))
                .map_or(host.as_str(), |h| h);
            let (host, exact) = match host.strip_prefix('.') {
                Some(_) => (host.to_owned(), false),
                None => (format!(".{host}"), true),
            };
            let host = GoUrl {
                scheme: String::new(),
                user: None,
                host,
                path: String::new(),
            }
            .ascii_hostname();
            no_proxy.rules.push(Rule::Domain { host, port, exact });
        }
        no_proxy
    }

    /// Whether a request to `hostname:port` (Go's canonical address, IDNA applied) goes
    /// without the environment's proxy: httpproxy's `useProxy`, negated, behind client-go's
    /// CIDR check.
    pub fn bypasses(&self, hostname: &str, port: &str) -> bool {
        if let Some(ip) = parse_ip_sloppy(hostname)
            && self.sloppy_cidrs.iter().any(|c| c.contains(ip))
        {
            return true;
        }
        // Exactly "localhost": Go compares before lower-casing.
        if hostname == "localhost" {
            return true;
        }
        let ip = parse_ip(hostname);
        if ip.is_some_and(loopback) {
            return true;
        }
        if self.all {
            return true;
        }
        let host = hostname.trim().to_ascii_lowercase();
        self.rules.iter().any(|rule| match (rule, ip) {
            (Rule::Cidr(cidr), Some(ip)) => cidr.contains(ip),
            (Rule::Ip { ip: want, port: p }, Some(ip)) => {
                want.to_canonical() == ip.to_canonical() && (p.is_empty() || p == port)
            }
            (
                Rule::Domain {
                    host: suffix,
                    port: p,
                    exact,
                },
                None,
            ) => {
                (host.ends_with(suffix.as_str()) || (*exact && host == suffix[1..]))
                    && (p.is_empty() || p == port)
            }
            _ => false,
        })
    }
}

/// `net.SplitHostPort` (enough of it for `NO_PROXY` entries): `host:port` or `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let port = rest[end + 1..].strip_prefix(':')?;
        return (!port.contains(':')).then_some((&s[..end + 2], port));
    }
    let (host, port) = s.rsplit_once(':')?;
    (!host.contains(':')).then_some((host, port))
}

/// The proxy settings of the environment, read as Go's `httpproxy.FromEnvironment` reads
/// them: `HTTPS_PROXY`, else `https_proxy`; `NO_PROXY`, else `no_proxy`; an empty value
/// counts as unset. Only the https proxy matters: an API server is always https.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    https_proxy: String,
    no_proxy: NoProxy,
}

impl ProxyEnv {
    pub fn from_process() -> ProxyEnv {
        let var = |name: &str| {
            std::env::var_os(name)
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        ProxyEnv::from_vars(
            &var("HTTPS_PROXY"),
            &var("https_proxy"),
            &var("NO_PROXY"),
            &var("no_proxy"),
        )
    }

    pub fn from_vars(upper: &str, lower: &str, no_upper: &str, no_lower: &str) -> ProxyEnv {
        let first = |a: &str, b: &str| if a.is_empty() { b } else { a }.to_owned();
        ProxyEnv {
            https_proxy: first(upper, lower),
            no_proxy: NoProxy::parse(&first(no_upper, no_lower)),
        }
    }

    /// httpproxy's `parseProxy`: a value without a scheme or host is read as `http://…`;
    /// one that does not parse either way means no proxy (Go drops it silently).
    fn proxy(&self) -> Option<GoUrl> {
        if self.https_proxy.is_empty() {
            return None;
        }
        match GoUrl::parse(&self.https_proxy) {
            Ok(url) if !url.host.is_empty() => Some(url),
            _ => GoUrl::parse(&format!("http://{}", self.https_proxy)).ok(),
        }
    }
}

/// The schemes a kubeconfig's `proxy-url` may have (client-go's `parseProxyURL`) and the
/// ones Go's transport speaks for an environment proxy.
const KUBECONFIG_PROXY_SCHEMES: &[&str] = &["http", "https", "socks5"];
const TRANSPORT_PROXY_SCHEMES: &[&str] = &["http", "https", "socks5", "socks5h"];

/// The proxy client-go uses for `server`: the cluster's `proxy-url` whatever the server
/// (loopback included), else the environment's unless `NO_PROXY` or loopback says
/// otherwise; `None` is a direct connection. An error is a proxy client-go could not use
/// either.
pub fn proxy_for(server: &GoUrl, proxy_url: &str, env: &ProxyEnv) -> Result<Option<GoUrl>, String> {
    if !proxy_url.is_empty() {
        let proxy = GoUrl::parse(proxy_url)
            .map_err(|why| format!("the cluster's proxy-url is not a URL ({why})"))?;
        if !KUBECONFIG_PROXY_SCHEMES.contains(&proxy.scheme.as_str()) {
            return Err("the cluster's proxy-url is not http, https or socks5".to_owned());
        }
        return Ok(Some(proxy));
    }
    let Some(proxy) = env.proxy() else {
        return Ok(None);
    };
    if env
        .no_proxy
        .bypasses(&server.ascii_hostname(), server.dial_port())
    {
        return Ok(None);
    }
    if !TRANSPORT_PROXY_SCHEMES.contains(&proxy.scheme.as_str()) {
        return Err(format!(
            "the broker's HTTPS_PROXY has scheme {:?}, which Go's transport does not speak",
            proxy.scheme
        ));
    }
    Ok(Some(proxy))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVIEW: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

    fn url(s: &str) -> GoUrl {
        GoUrl::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn request_paths_are_built_as_client_go_builds_them() {
        for (server, path) in [
            ("https://h:1", REVIEW.to_owned()),
            ("https://h:1/", REVIEW.to_owned()),
            ("https://h:1/prefix", format!("/prefix{REVIEW}")),
            ("https://h:1/prefix/", format!("/prefix{REVIEW}")),
            ("https://h:1/a//b/./c/../", format!("/a/b{REVIEW}")),
            // A path never names a host: client-go asks h:1 for /other:2/….
            ("https://h:1//other:2/", format!("/other:2{REVIEW}")),
            ("https://h:1///other:2", format!("/other:2{REVIEW}")),
            // Escapes are decoded, then the path escaped again as Go escapes it.
            ("https://h:1/a%2Fb", format!("/a/b{REVIEW}")),
            ("https://h:1/%2F%2Fother:2", format!("/other:2{REVIEW}")),
            ("https://h:1/a b(c)", format!("/a%20b%28c%29{REVIEW}")),
            ("https://h:1/p?q=1#f", format!("/p{REVIEW}")),
            ("https://h:1/..", REVIEW.to_owned()),
        ] {
            assert_eq!(request_path(&url(server), REVIEW), path, "{server}");
        }
    }

    #[test]
    fn servers_split_as_go_splits_them() {
        let u = url("https://us%40er:p%3Ass@127.0.0.1:6443//other:1/x");
        assert_eq!(u.host, "127.0.0.1:6443");
        assert_eq!(u.hostname(), "127.0.0.1");
        assert_eq!(u.port(), "6443");
        assert_eq!(u.user, Some(("us@er".to_owned(), Some("p:ss".to_owned()))));
        assert_eq!(u.path, "//other:1/x");
        // base64("us@er:p:ss")
        assert_eq!(u.basic_auth().as_deref(), Some("Basic dXNAZXI6cDpzcw=="));
        assert!(!format!("{u:?}").contains("p:ss"));
        // The last @ ends the userinfo.
        let u = url("https://a@b@h:1");
        assert_eq!(u.hostname(), "h");
        assert_eq!(u.user, Some(("a@b".to_owned(), None)));
        assert_eq!(u.basic_auth().as_deref(), Some("Basic YUBiOg=="));
        let u = url("HTTPS://[::ffff:127.0.0.1]:8443");
        assert_eq!(u.scheme, "https");
        assert_eq!(u.hostname(), "::ffff:127.0.0.1");
        assert_eq!(u.authority(), "[::ffff:127.0.0.1]:8443");
        assert_eq!(url("https://Api.Example").authority(), "Api.Example:443");
        assert_eq!(
            url("https://bücher.example:1").authority(),
            "xn--bcher-kva.example:1"
        );
        for bad in [
            "https://h:1/%zz",
            "https://h:port",
            "https://[::1",
            "https://[nope]:1",
            "https://h h:1",
            "https://u ser@h",
            "h:1",
            "https:h",
            "https://h\n",
        ] {
            assert!(GoUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_proxy_matches_as_go_httpproxy() {
        let cases: &[(&str, &str, &str, bool)] = &[
            // (NO_PROXY, host, port, bypasses)
            ("", "example.com", "443", false),
            // Loopback never goes through the environment's proxy.
            ("", "localhost", "443", true),
            ("", "127.0.0.1", "443", true),
            ("", "127.9.9.9", "443", true),
            ("", "::1", "443", true),
            ("", "::ffff:127.0.0.1", "443", true),
            // Only exactly "localhost" (Go compares before lower-casing), and names
            // that resolve to loopback are not loopback.
            ("", "LOCALHOST", "443", false),
            ("", "localhost.localdomain", "443", false),
            ("", "vm", "443", false),
            ("", "0.0.0.0", "443", false),
            // Leading zeros: not an IP for Go, a name.
            ("", "127.000.000.001", "443", false),
            ("*", "example.com", "443", true),
            ("*", "10.0.0.1", "443", true),
            ("foo, *", "example.com", "443", true),
            // Names: the name and its subdomains.
            ("example.com", "example.com", "443", true),
            ("example.com", "a.example.com", "443", true),
            ("example.com", "badexample.com", "443", false),
            ("Example.COM ", "EXAMPLE.com", "443", true),
            // A leading dot or *.: subdomains only.
            (".example.com", "example.com", "443", false),
            (".example.com", "a.example.com", "443", true),
            ("*.example.com", "example.com", "443", false),
            ("*.example.com", "a.b.example.com", "443", true),
            // Ports.
            ("example.com:6443", "example.com", "6443", true),
            ("example.com:6443", "example.com", "443", false),
            ("10.0.0.1:6443", "10.0.0.1", "6443", true),
            ("10.0.0.1:6443", "10.0.0.1", "443", false),
            ("[2001:db8::1]:6443", "2001:db8::1", "6443", true),
            // IPs match IP entries only, never names.
            ("10.0.0.1", "10.0.0.1", "443", true),
            ("10.0.0.1", "10.0.0.2", "443", false),
            ("10.0.0.1", "::ffff:10.0.0.1", "443", true),
            ("2001:db8::1", "2001:db8::1", "443", true),
            ("example.com", "10.0.0.1", "443", false),
            // CIDRs, for IP hosts.
            ("10.0.0.0/8", "10.1.2.3", "443", true),
            ("10.0.0.0/8", "11.1.2.3", "443", false),
            ("10.0.0.0/8", "::ffff:10.1.2.3", "443", true),
            ("2001:db8::/32", "2001:db8::5", "443", true),
            ("2001:db8::/32", "2001:db9::5", "443", false),
            ("10.0.0.0/8", "ten.example", "443", false),
            // client-go's CIDR check reads leading zeros.
            ("10.0.0.0/8", "010.001.002.003", "443", true),
            // Malformed entries are skipped.
            (":443, , [", "example.com", "443", false),
        ];
        for (list, host, port, want) in cases {
            assert_eq!(
                NoProxy::parse(list).bypasses(host, port),
                *want,
                "NO_PROXY={list:?} host={host} port={port}"
            );
        }
    }

    #[test]
    fn the_environment_is_read_as_go_reads_it() {
        let server = url("https://api.example:6443");
        let via = |env: &ProxyEnv| {
            proxy_for(&server, "", env)
                .expect("a usable proxy")
                .map(|p| p.authority())
        };
        // HTTPS_PROXY before https_proxy; an empty one counts as unset.
        let env = ProxyEnv::from_vars("http://upper:1", "http://lower:2", "", "");
        assert_eq!(via(&env).as_deref(), Some("upper:1"));
        let env = ProxyEnv::from_vars("", "http://lower:2", "", "");
        assert_eq!(via(&env).as_deref(), Some("lower:2"));
        // NO_PROXY before no_proxy.
        let env = ProxyEnv::from_vars("http://p:1", "", "other.example", "api.example");
        assert_eq!(via(&env).as_deref(), Some("p:1"));
        let env = ProxyEnv::from_vars("http://p:1", "", "", "api.example");
        assert_eq!(via(&env), None);
        // No scheme: http. A port-less proxy gets its scheme's port.
        let env = ProxyEnv::from_vars("127.0.0.1:3128", "", "", "");
        let proxy = proxy_for(&server, "", &env).unwrap().unwrap();
        assert_eq!(
            (proxy.scheme.as_str(), proxy.authority().as_str()),
            ("http", "127.0.0.1:3128")
        );
        let env = ProxyEnv::from_vars("proxy.corp", "", "", "");
        assert_eq!(via(&env).as_deref(), Some("proxy.corp:80"));
        let env = ProxyEnv::from_vars("socks5://s", "", "", "");
        assert_eq!(via(&env).as_deref(), Some("s:1080"));
        // Nothing set: direct.
        assert_eq!(via(&ProxyEnv::default()), None);
    }

    #[test]
    fn a_kubeconfig_proxy_is_used_for_every_server() {
        let env = ProxyEnv::from_vars("http://env:1", "", "*", "");
        for server in [
            "https://127.0.0.1:1",
            "https://localhost:1",
            "https://api.example",
        ] {
            let proxy = proxy_for(&url(server), "http://explicit:3128", &env).unwrap();
            assert_eq!(
                proxy.map(|p| p.authority()).as_deref(),
                Some("explicit:3128"),
                "{server}"
            );
        }
        for bad in ["ftp://p:1", "socks5h://p:1", "p:1"] {
            assert!(proxy_for(&url("https://h"), bad, &env).is_err(), "{bad}");
        }
    }
}
