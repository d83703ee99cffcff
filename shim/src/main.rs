//! `credbroker-shim`: the kubeconfig exec plugin client-go runs. It forwards
//! `KUBERNETES_EXEC_INFO` to the credbroker sidecar as one `TokenService/GetToken` call over
//! a Unix socket and prints the answer as an `ExecCredential`.
//!
//! client-go shows a failing plugin only as "exit code 1" plus its stderr in the Kueue log,
//! so every failure here is exactly one line, `credbroker-shim: <what failed>: <why> (<hint>)`,
//! with nothing on stdout. The binary is static and small: it is exec'd for every credential.

mod caller;
mod connect;
mod install;

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use credbroker_execcred::{ApiVersion, EXEC_INFO_ENV, exec_credential, parse_exec_info};
use credbroker_proto::text::{controls_escaped, controls_escaped_cut};
use credbroker_proto::v1::{Cluster, GetTokenRequest, GetTokenResponse};
use credbroker_proto::{DEFAULT_SOCKET_PATH as DEFAULT_SOCKET, code_name_of};
use credbroker_shim::wire::{self, Answer, GET_TOKEN, WireError};
use prost::Message as _;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const SOCKET_ENV: &str = "CREDBROKER_SOCKET";
const USAGE: &str = "credbroker-shim --provider NAME [--socket PATH] [--timeout DURATION]";

const HELP: &str = "\
credbroker-shim: kubeconfig exec plugin that asks the credbroker sidecar for a credential.

Usage: credbroker-shim --provider NAME [--socket PATH] [--timeout DURATION]
       credbroker-shim install DIR [--name NAME]

Options:
  --provider NAME      broker provider to ask (providers[].name in the broker config)
  --socket PATH        broker's Unix socket [env CREDBROKER_SOCKET,
                       default /var/run/credbroker/broker.sock]
  --timeout DURATION   give up after this long: 500ms, 30s, 2m, 1h, 1m30s [default 30s]
  -h, --help           print this help
  -V, --version        print the version

Reads KUBERNETES_EXEC_INFO (set by client-go) and prints one ExecCredential of the same
apiVersion on stdout. On failure prints one line on stderr and exits 1.

install DIR [--name NAME]
  Copies this executable (/proc/self/exe) to DIR/NAME, mode 0755, atomically: written to
  DIR/.NAME.tmp-PID, fsynced, renamed over DIR/NAME. DIR must exist. Replaces only an
  earlier copy of credbroker-shim (an ELF file holding the marker every shim carries, at
  most 8 times this one's size) and refuses anything else there, symlinks and directories
  included, a bigger file unread. For an init container
  filling the volume Kueue's manager runs the shim from. Prints one line; on failure one
  line on stderr, nothing left behind, exit 1.
  --name NAME          the file name in DIR [default credbroker-shim]
";

/// One failure, shown to the operator as a single stderr line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    what: String,
    why: String,
    hint: String,
}

impl Failure {
    fn new(what: impl Into<String>, why: impl Into<String>, hint: impl Into<String>) -> Self {
        Failure {
            what: what.into(),
            why: why.into(),
            hint: hint.into(),
        }
    }

    /// `credbroker-shim: <what>: <why> (<hint>)`, forced onto one line with every control
    /// character escaped: client-go logs the plugin's stderr, and the broker's messages (or a
    /// broken connection's) could carry newlines or terminal escapes from outside text.
    pub fn line(&self) -> String {
        let line = format!(
            "credbroker-shim: {}: {} ({})",
            self.what, self.why, self.hint
        );
        controls_escaped(&line).into_owned()
    }
}

/// How much of the peer's text (`grpc-message`, or what a broken answer held) the error line
/// shows, in bytes once its control characters are escaped: the broker cuts its own messages
/// to this (`MAX_STATUS_MESSAGE_BYTES` in broker/src/grpc/status.rs) and escapes them, so its
/// messages are shown whole; another server's 60 KB message is not copied onto the one line
/// client-go puts in Kueue's log.
const MAX_PEER_TEXT_BYTES: usize = 2048;

/// `text` escaped (see [`controls_escaped`]) and cut to [`MAX_PEER_TEXT_BYTES`] bytes of
/// escaped text, a cut marked with the original length as [`shown`] does.
fn peer_text(text: &str) -> String {
    controls_escaped_cut(text, MAX_PEER_TEXT_BYTES)
}

/// A command-line mistake, with the usage as the hint.
fn usage_error(why: impl Into<String>) -> Failure {
    Failure::new(
        "invalid arguments",
        why,
        format!("usage: {USAGE}; see --help"),
    )
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run(Args),
    /// `install DIR [--name NAME]`: only as the first argument.
    Install(install::InstallArgs),
    Help,
    Version,
}

/// The options of a normal run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub provider: String,
    /// `--socket`; `None` falls back to `CREDBROKER_SOCKET`, then the default path.
    pub socket: Option<PathBuf>,
    pub timeout: Duration,
}

/// Parses the arguments after the program name. Accepts `--flag value` and `--flag=value`;
/// `--help`/`--version` win over everything else; unknown flags, positional arguments and
/// repeated flags are errors (a kubeconfig typo should fail loudly, not be ignored). The
/// `install` subcommand is recognised only as the first argument, so `--provider install`
/// is a provider named "install", as client-go's runs always start with a flag.
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Command, Failure> {
    let args = args
        .into_iter()
        .map(|a| {
            a.into_string().map_err(|a| {
                usage_error(format!(
                    "argument {:?} is not valid UTF-8",
                    a.to_string_lossy()
                ))
            })
        })
        .collect::<Result<Vec<String>, Failure>>()?;
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(Command::Help);
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        return Ok(Command::Version);
    }
    if args.first().is_some_and(|a| a == "install") {
        return install::parse_args(args.into_iter().skip(1).collect()).map(Command::Install);
    }

    let (mut provider, mut socket, mut timeout) = (None, None, None);
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let slot = match flag.as_str() {
            "--provider" => &mut provider,
            "--socket" => &mut socket,
            "--timeout" => &mut timeout,
            f if f.starts_with('-') => {
                return Err(usage_error(format!("unknown flag {}", shown(f))));
            }
            "install" => {
                return Err(usage_error(
                    "unexpected argument \"install\" (the install subcommand comes first: \
                     credbroker-shim install DIR)",
                ));
            }
            f => return Err(usage_error(format!("unexpected argument {}", shown(f)))),
        };
        let value = match inline.or_else(|| rest.next()) {
            Some(v) if !v.is_empty() => v,
            _ => return Err(usage_error(format!("{flag} needs a non-empty value"))),
        };
        if slot.replace(value).is_some() {
            return Err(usage_error(format!("{flag} given more than once")));
        }
    }

    let provider = provider.ok_or_else(|| usage_error("missing --provider"))?;
    let timeout = match timeout {
        None => DEFAULT_TIMEOUT,
        Some(t) => parse_duration(&t)
            .map_err(|why| usage_error(format!("--timeout {}: {why}", shown(&t))))?,
    };
    Ok(Command::Run(Args {
        provider,
        socket: socket.map(PathBuf::from),
        timeout,
    }))
}

/// How much of an argument an error line quotes: a provider name (DNS-1123, at most 253
/// bytes, is recognisable from its start) or a flag, not a 100 KB argument on the one line
/// client-go copies into Kueue's log.
const SHOWN_CHARS: usize = 64;

/// `s` quoted for the error line: at most [`SHOWN_CHARS`] characters, escaped as Rust's
/// `{:?}` does (control characters included), a cut marked with the whole length.
fn shown(s: &str) -> String {
    let count = s.chars().count();
    if count <= SHOWN_CHARS {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}…({} bytes)", s.len())
}

const NOT_A_DURATION: &str = "expected whole numbers followed by ms, s, m or h, like 1m30s";

/// Parses a Go-style duration made of `<integer><unit>` parts, units `ms`, `s`, `m`, `h`
/// (`500ms`, `30s`, `1m30s`). Zero is refused: it could never succeed.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err("empty duration".to_owned());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let n: u64 = number.parse().map_err(|_| NOT_A_DURATION.to_owned())?;
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "" if tail.is_empty() => return Err(format!("{number} has no unit (ms, s, m or h)")),
            "" => return Err(NOT_A_DURATION.to_owned()),
            u => return Err(format!("unknown unit {u:?} (use ms, s, m or h)")),
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or("duration too large")?;
        rest = tail;
    }
    if total.is_zero() {
        return Err("must be more than zero".to_owned());
    }
    Ok(total)
}

/// The socket to dial: `--socket`, else `CREDBROKER_SOCKET` (when set and non-empty), else
/// the path the sidecar manifests use.
pub fn resolve_socket(flag: Option<&Path>, env: Option<OsString>) -> PathBuf {
    match (flag, env) {
        (Some(path), _) => path.to_path_buf(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from(DEFAULT_SOCKET),
    }
}

/// Reads `KUBERNETES_EXEC_INFO`; unset is fine (old clients), non-UTF-8 is not.
fn read_exec_info_env() -> Result<Option<String>, Failure> {
    match std::env::var(EXEC_INFO_ENV) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(exec_info_failure("not valid UTF-8".to_owned()))
        }
    }
}

fn exec_info_failure(why: String) -> Failure {
    Failure::new(
        format!("cannot use {EXEC_INFO_ENV}"),
        why,
        "client-go sets it from the kubeconfig exec entry and the ClusterProfile; \
         check the exec apiVersion (v1 or v1beta1) and the cluster's data",
    )
}

/// The whole shim after argument parsing: exec info in, ExecCredential JSON out.
/// Connecting and the call together never take longer than `args.timeout`: the socket
/// keeps that deadline ([`connect`]).
pub fn run(args: &Args, socket: &Path, exec_info: Option<&str>) -> Result<String, Failure> {
    let deadline = Instant::now() + args.timeout;
    let info = parse_exec_info(exec_info).map_err(|e| exec_info_failure(e.to_string()))?;
    let request = GetTokenRequest {
        provider: args.provider.clone(),
        // The config as the text client-go wrote, as it wrote it (never the deprecated Struct).
        cluster: info.cluster.map(Cluster::from),
        interactive: info.interactive,
        caller: caller::this_caller(exec_info),
    };
    let response = get_token(socket, &request.encode_to_vec(), deadline)
        .map_err(|e| e.failure(&args.provider, socket, args.timeout))?;
    exec_credential_json(info.api_version, &response, unix_now()).map_err(|why| {
        Failure::new(
            "unusable answer from the broker",
            why,
            "this is a broker bug; check the broker's version and log",
        )
    })
}

/// Renders the broker's answer as the ExecCredential client-go reads (see
/// [`exec_credential::render`] for what is refused).
fn exec_credential_json(
    api_version: ApiVersion,
    resp: &GetTokenResponse,
    now_unix: i64,
) -> Result<String, String> {
    if let Some(bad) = resp.token.bytes().find(|&b| !is_header_value_byte(b)) {
        return Err(format!(
            "the token holds the control character {bad:#04x}, which client-go cannot send: \
             it puts the token in an HTTP header (Authorization: Bearer …), and Go's HTTP \
             client refuses a header value with any control character but tab"
        ));
    }
    let status = exec_credential::Status {
        token: &resp.token,
        client_certificate_data: &resp.client_certificate_data,
        client_key_data: &resp.client_key_data,
        expiration_unix: resp.expiration_time.as_ref().map(|t| t.seconds),
    };
    exec_credential::render(api_version, &status, now_unix).map_err(|e| e.to_string())
}

/// Whether `b` may stand in an HTTP header value as Go's HTTP client checks it
/// (`httpguts.ValidHeaderFieldValue`, RFC 9110 §5.5's field-value): visible ASCII, space,
/// tab, and bytes 0x80 and up (obs-text; a UTF-8 token's other characters). Every other
/// control character (NUL, CR, LF, ESC, DEL, …) makes client-go's every request with the
/// token fail ("invalid header field value"), so the shim refuses the answer instead of
/// printing a credential that cannot work, with exit 0.
fn is_header_value_byte(b: u8) -> bool {
    b == b'\t' || !(b < b' ' || b == 0x7f)
}

/// Seconds since the Unix epoch; a clock before 1970 reads as 0.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Why the call failed, before it is worded for the operator.
#[derive(Debug)]
enum CallError {
    /// The deadline passed: connecting (a full backlog) or waiting for the answer.
    TimedOut,
    Connect(std::io::Error),
    Wire(WireError),
    /// The broker answered with an error status.
    Status(Answer),
    /// An OK answer whose message is not a GetTokenResponse.
    Decode(prost::DecodeError),
}

impl CallError {
    fn failure(self, provider: &str, socket: &Path, timeout: Duration) -> Failure {
        match self {
            CallError::TimedOut => Failure::new(
                "timed out waiting for the broker",
                format!(
                    "no answer from the broker at {} within {timeout:?}",
                    socket.display()
                ),
                "check the broker's log; raise --timeout if the upstream is slow",
            ),
            CallError::Connect(e) => Failure::new(
                format!("cannot connect to the broker at {}", socket.display()),
                e.to_string(),
                "is the credbroker sidecar running and the socket volume shared with this \
                 container? set --socket or CREDBROKER_SOCKET",
            ),
            CallError::Wire(e @ (WireError::Protocol(_) | WireError::Connection(..))) => {
                Failure::new(
                    format!("GetToken call to the broker at {} failed", socket.display()),
                    peer_text(&e.to_string()),
                    "is the socket credbroker's? check the broker's version",
                )
            }
            CallError::Wire(e) => Failure::new(
                format!("GetToken call to the broker at {} failed", socket.display()),
                peer_text(&e.to_string()),
                "the connection broke; check that the broker is healthy (its log) and that \
                 the socket is credbroker's",
            ),
            CallError::Status(answer) => status_failure(&answer, provider),
            CallError::Decode(e) => Failure::new(
                "unusable answer from the broker",
                format!("the GetToken answer does not decode: {e}"),
                "is the socket credbroker's? check the broker's version",
            ),
        }
    }
}

/// Connects to the broker's Unix socket and makes the one `GetToken` call.
fn get_token(
    socket: &Path,
    message: &[u8],
    deadline: Instant,
) -> Result<GetTokenResponse, CallError> {
    let mut stream = connect::connect(socket, deadline).map_err(|e| match e {
        connect::ConnectError::TimedOut => CallError::TimedOut,
        connect::ConnectError::Io(e) => CallError::Connect(e),
    })?;
    let answer = wire::unary(&mut stream, GET_TOKEN, message).map_err(|e| match e {
        WireError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => CallError::TimedOut,
        e => CallError::Wire(e),
    })?;
    if answer.code != 0 {
        return Err(CallError::Status(answer));
    }
    GetTokenResponse::decode(answer.body.as_slice()).map_err(CallError::Decode)
}

/// Turns the broker's error status into a line that says what the operator should do.
fn status_failure(answer: &Answer, provider: &str) -> Failure {
    let code = code_name_of(answer.code);
    let why = if answer.message.is_empty() {
        code.to_owned()
    } else {
        format!("{code}: {}", peer_text(&answer.message))
    };
    Failure::new(
        format!(
            "the broker could not serve GetToken for provider {}",
            shown(provider)
        ),
        why,
        hint(answer),
    )
}

/// What the operator should do about a status: chosen by the broker's `ErrorInfo` reason
/// (`credbroker_proto::reason`), never by the message text; by the code when the status
/// has no credbroker reason.
fn hint(answer: &Answer) -> &'static str {
    use credbroker_proto::reason;
    let info = wire::error_info(&answer.details).filter(|info| info.domain == reason::DOMAIN);
    let why = info.as_ref().map(|info| info.reason.as_str());
    match (why, code_name_of(answer.code)) {
        (Some(reason::UNKNOWN_PROVIDER), _) => {
            "check --provider against providers[].name in the broker config"
        }
        (Some(reason::SOURCE_NOT_FOUND), _) | (None, "NOT_FOUND") => {
            "the credential's source for this cluster is missing (the message names it); \
             check it and the cluster's client.authentication.k8s.io/exec extension"
        }
        (_, "INVALID_ARGUMENT") => {
            "check the ClusterProfile's client.authentication.k8s.io/exec extension"
        }
        (_, "PERMISSION_DENIED") => {
            "the broker or the cloud refused this caller/identity; check socket.allowedUids \
             and the identity's permissions"
        }
        (_, "UNAVAILABLE" | "DEADLINE_EXCEEDED") => "upstream unavailable; client-go will retry",
        (Some(reason::RATE_LIMITED), _) | (None, "RESOURCE_EXHAUSTED") => {
            "this caller is over the broker's rate limit; client-go will retry, but look for \
             a loop re-running the plugin"
        }
        (Some(reason::PROVIDER_UNIMPLEMENTED), _) => {
            "the broker cannot serve this provider as built or configured; the message says \
             what is missing"
        }
        // No credbroker reason: tonic's own answer for an unknown method, from another gRPC
        // server on this socket (or a broker too old to send reasons).
        (None, "UNIMPLEMENTED") => "is the socket credbroker's? check the broker's version",
        _ => "check the broker's log",
    }
}

/// Resolves the environment, makes the call and returns what to print on stdout.
fn real_main() -> Result<String, Failure> {
    let args = match parse_args(std::env::args_os().skip(1))? {
        Command::Help => return Ok(HELP.to_owned()),
        Command::Version => return Ok(format!("credbroker-shim {}\n", env!("CARGO_PKG_VERSION"))),
        Command::Install(args) => return install::install(&args).map(|done| done.line() + "\n"),
        Command::Run(args) => args,
    };
    let socket = resolve_socket(args.socket.as_deref(), std::env::var_os(SOCKET_ENV));
    let exec_info = read_exec_info_env()?;
    let json = run(&args, &socket, exec_info.as_deref())?;
    Ok(json + "\n")
}

fn main() -> ExitCode {
    let result = real_main().and_then(|out| {
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(|e| {
                Failure::new(
                    "cannot write to stdout",
                    e.to_string(),
                    "client-go reads the credential from a pipe; did it stop waiting?",
                )
            })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            // Nothing sensible is left to do if stderr is gone too.
            let _ = writeln!(std::io::stderr(), "{}", failure.line());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use credbroker_proto::v1::token_service_server::{TokenService, TokenServiceServer};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn run_args(args: &[&str]) -> Args {
        match parse_args(os(args)).unwrap() {
            Command::Run(a) => a,
            other => panic!("expected a run, got {other:?}"),
        }
    }

    #[test]
    fn args_space_and_equals_forms() {
        let want = Args {
            provider: "eks".into(),
            socket: Some("/s.sock".into()),
            timeout: Duration::from_millis(1500),
        };
        for args in [
            &[
                "--provider",
                "eks",
                "--socket",
                "/s.sock",
                "--timeout",
                "1s500ms",
            ][..],
            &["--provider=eks", "--socket=/s.sock", "--timeout=1s500ms"],
            &["--timeout=1s500ms", "--socket", "/s.sock", "--provider=eks"],
        ] {
            assert_eq!(run_args(args), want, "{args:?}");
        }
    }

    #[test]
    fn args_defaults_and_values_with_equals() {
        let a = run_args(&["--provider", "gke"]);
        assert_eq!(a.socket, None);
        assert_eq!(a.timeout, DEFAULT_TIMEOUT);
        // Only the first '=' splits: a path may contain more.
        assert_eq!(
            run_args(&["--provider=p", "--socket=/a=b.sock"]).socket,
            Some(PathBuf::from("/a=b.sock"))
        );
    }

    #[test]
    fn help_and_version_win() {
        assert_eq!(parse_args(os(&["--help"])).unwrap(), Command::Help);
        assert_eq!(parse_args(os(&["--bogus", "-h"])).unwrap(), Command::Help);
        assert_eq!(parse_args(os(&["--version"])).unwrap(), Command::Version);
        assert_eq!(
            parse_args(os(&["-V", "--provider"])).unwrap(),
            Command::Version
        );
    }

    #[test]
    fn install_is_only_the_first_argument() {
        assert_eq!(
            parse_args(os(&["install", "/install/bin"])).unwrap(),
            Command::Install(install::InstallArgs {
                dir: "/install/bin".into(),
                name: "credbroker-shim".into(),
            })
        );
        // A provider named "install" is a normal run, whatever the order of the flags.
        assert_eq!(run_args(&["--provider", "install"]).provider, "install");
        assert_eq!(
            run_args(&["--socket", "/s", "--provider=install"]).provider,
            "install"
        );
        let f = parse_args(os(&["--provider", "p", "install", "/d"])).unwrap_err();
        assert!(f.why.contains("install subcommand comes first"), "{f:?}");
        assert_eq!(
            parse_args(os(&["install", "--help"])).unwrap(),
            Command::Help
        );
        let f = parse_args(os(&["install"])).unwrap_err();
        assert!(f.hint.contains(install::USAGE), "{f:?}");
    }

    #[test]
    fn help_documents_install() {
        for needle in [
            "credbroker-shim install DIR [--name NAME]",
            "--name NAME",
            "mode 0755",
            "atomically",
            "earlier copy of credbroker-shim",
        ] {
            assert!(HELP.contains(needle), "{needle}");
        }
        assert!(HELP.lines().all(|l| l.len() <= 92), "{HELP}");
    }

    #[test]
    fn bad_args_are_usage_errors() {
        let cases = [
            (&[][..], "missing --provider"),
            (&["--socket", "/s"], "missing --provider"),
            (&["--provider"], "--provider needs a non-empty value"),
            (&["--provider="], "--provider needs a non-empty value"),
            (
                &["--provider", "a", "--provider", "b"],
                "--provider given more than once",
            ),
            (
                &["--provider", "a", "--region", "x"],
                "unknown flag \"--region\"",
            ),
            (&["--provider=a", "--region=x"], "unknown flag \"--region\""),
            (&["--provider", "a", "-p"], "unknown flag \"-p\""),
            (
                &["--provider", "a", "extra"],
                "unexpected argument \"extra\"",
            ),
            (
                &["--provider", "a", "--timeout", "30"],
                "--timeout \"30\": 30 has no unit",
            ),
            (
                &["--provider", "a", "--timeout=0s"],
                "must be more than zero",
            ),
        ];
        for (args, want) in cases {
            let f = parse_args(os(args)).unwrap_err();
            assert_eq!(f.what, "invalid arguments");
            assert!(
                f.why.contains(want),
                "{args:?}: got {:?}, want {want:?}",
                f.why
            );
            assert!(f.hint.contains(USAGE));
        }
    }

    #[cfg(unix)]
    #[test]
    fn non_utf8_argument_is_an_error() {
        use std::os::unix::ffi::OsStringExt as _;
        let args = vec![OsString::from("--provider"), OsString::from_vec(vec![0xff])];
        let f = parse_args(args).unwrap_err();
        assert!(f.why.contains("not valid UTF-8"), "{f:?}");
    }

    #[test]
    fn durations() {
        let ok = [
            ("500ms", Duration::from_millis(500)),
            ("30s", Duration::from_secs(30)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("1m30s", Duration::from_secs(90)),
            ("1h2m3s4ms", Duration::from_millis(3_723_004)),
            ("0s1ms", Duration::from_millis(1)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        let bad = [
            ("", "empty"),
            ("30", "no unit"),
            ("s", "whole number"),
            ("1.5s", "whole number"),
            ("-1s", "whole number"),
            ("10d", "unknown unit \"d\""),
            ("5 s", "whole number"),
            ("0ms", "more than zero"),
            ("99999999999999999999s", "whole number"),
            ("9999999999999999999h", "too large"),
        ];
        for (text, want) in bad {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(want), "{text}: got {err:?}, want {want:?}");
        }
    }

    #[test]
    fn socket_resolution_order() {
        let flag = Path::new("/flag.sock");
        let env = || Some(OsString::from("/env.sock"));
        assert_eq!(
            resolve_socket(Some(flag), env()),
            PathBuf::from("/flag.sock")
        );
        assert_eq!(resolve_socket(None, env()), PathBuf::from("/env.sock"));
        assert_eq!(
            resolve_socket(None, Some(OsString::new())),
            PathBuf::from(DEFAULT_SOCKET)
        );
        assert_eq!(resolve_socket(None, None), PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn failure_line_is_one_line() {
        let f = Failure::new("what", "broker said:\nline two\r\n", "do this");
        assert_eq!(
            f.line(),
            "credbroker-shim: what: broker said:\\nline two\\r\\n (do this)"
        );
        let f = Failure::new(
            "w",
            "plugin: \u{1b}[2J\u{1b}]0;x\u{7} \u{9b}1m \u{202e}",
            "h",
        );
        let line = f.line();
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert_eq!(
            line,
            "credbroker-shim: w: plugin: \\u{1b}[2J\\u{1b}]0;x\\u{7} \\u{9b}1m \\u{202e} (h)"
        );
    }

    /// What [`wire::unary`] reads from the broker for `status`: its code, message and
    /// details, as tonic puts them on the wire.
    fn answer(status: &tonic::Status) -> Answer {
        Answer {
            code: status.code() as i32,
            message: status.message().to_owned(),
            details: status.details().to_vec(),
            body: Vec::new(),
        }
    }

    /// [`run`] off the runtime's thread, which serves the fake broker meanwhile.
    async fn call(args: Args, socket: &Path, exec_info: Option<&str>) -> Result<String, Failure> {
        let socket = socket.to_path_buf();
        let exec_info = exec_info.map(str::to_owned);
        tokio::task::spawn_blocking(move || run(&args, &socket, exec_info.as_deref()))
            .await
            .unwrap()
    }

    /// A status as the broker sends it: code, message and an `ErrorInfo` with `reason`.
    fn broker_status(code: tonic::Code, message: &str, reason: &str) -> tonic::Status {
        use tonic_types::StatusExt as _;
        let details = tonic_types::ErrorDetails::with_error_info(
            reason,
            credbroker_proto::reason::DOMAIN,
            std::collections::HashMap::new(),
        );
        tonic::Status::with_error_details(code, message, details)
    }

    #[test]
    fn status_codes_get_hints() {
        use credbroker_proto::reason;
        let cases = [
            (
                tonic::Code::NotFound,
                reason::SOURCE_NOT_FOUND,
                "source for this cluster is missing",
            ),
            (
                tonic::Code::ResourceExhausted,
                reason::RATE_LIMITED,
                "rate limit",
            ),
            (
                tonic::Code::Unimplemented,
                reason::PROVIDER_UNIMPLEMENTED,
                "as built or configured",
            ),
            (
                tonic::Code::InvalidArgument,
                reason::INVALID_CLUSTER_INPUT,
                "client.authentication.k8s.io/exec extension",
            ),
            (
                tonic::Code::PermissionDenied,
                reason::CALLER_NOT_ALLOWED,
                "socket.allowedUids",
            ),
            (
                tonic::Code::Unavailable,
                reason::UPSTREAM_UNAVAILABLE,
                "client-go will retry",
            ),
            (
                tonic::Code::DeadlineExceeded,
                reason::UPSTREAM_TIMEOUT,
                "client-go will retry",
            ),
            (tonic::Code::Internal, reason::INTERNAL, "broker's log"),
        ];
        for (code, why, hint) in cases {
            let f = status_failure(
                &answer(&broker_status(code, "provider \"p\", cluster \"c\"", why)),
                "p",
            );
            assert_eq!(
                f.what,
                "the broker could not serve GetToken for provider \"p\""
            );
            assert_eq!(
                f.why,
                format!(
                    "{}: provider \"p\", cluster \"c\"",
                    code_name_of(code as i32)
                )
            );
            assert!(f.hint.contains(hint), "{code:?}: {}", f.hint);
        }
        let f = status_failure(&answer(&tonic::Status::new(tonic::Code::Internal, "")), "p");
        assert_eq!(f.why, "INTERNAL");
        let unknown = broker_status(
            tonic::Code::NotFound,
            "unknown provider \"p\" (configured: a)",
            credbroker_proto::reason::UNKNOWN_PROVIDER,
        );
        assert!(
            status_failure(&answer(&unknown), "p")
                .hint
                .contains("providers[].name")
        );
        let not_ours = tonic::Status::new(tonic::Code::Unimplemented, "");
        assert!(
            status_failure(&answer(&not_ours), "p")
                .hint
                .contains("credbroker's")
        );
    }

    #[test]
    fn hints_follow_the_reason_not_the_text() {
        use credbroker_proto::reason;
        let hint = |status: tonic::Status| status_failure(&answer(&status), "p").hint;
        // A source's message that happens to start like an unknown provider's.
        let source = broker_status(
            tonic::Code::NotFound,
            "unknown provider-side file /t/c",
            reason::SOURCE_NOT_FOUND,
        );
        assert!(hint(source).contains("source for this cluster is missing"));
        // An unknown provider whatever its message says.
        let unknown = broker_status(
            tonic::Code::NotFound,
            "no such thing",
            reason::UNKNOWN_PROVIDER,
        );
        assert!(hint(unknown).contains("providers[].name"));
        // The message alone no longer decides: no reason, the code's hint.
        let text_only = tonic::Status::not_found("unknown provider \"p\" (configured: a)");
        assert!(hint(text_only).contains("source for this cluster is missing"));
        // A reason from another domain is not credbroker's.
        let foreign = {
            use tonic_types::StatusExt as _;
            let details = tonic_types::ErrorDetails::with_error_info(
                reason::UNKNOWN_PROVIDER,
                "example.com",
                std::collections::HashMap::new(),
            );
            tonic::Status::with_error_details(tonic::Code::NotFound, "x", details)
        };
        assert!(hint(foreign).contains("source for this cluster is missing"));
        // The broker's own UNIMPLEMENTED vs. another server's.
        let not_built = broker_status(
            tonic::Code::Unimplemented,
            "",
            reason::PROVIDER_UNIMPLEMENTED,
        );
        assert!(hint(not_built).contains("as built or configured"));
        let other_server = tonic::Status::unimplemented("provider type aws is not built in");
        assert!(hint(other_server).contains("credbroker's"));
    }

    // ---- against a fake broker on a temporary socket ----

    #[derive(Clone, Copy, Debug)]
    enum Behaviour {
        Token,
        NotFound,
        Hang,
        /// A client certificate and key of 1.2 MB each: an answer over the shim's receive
        /// window, HTTP/2's initial windows and frame size.
        Big,
        /// A token of this text.
        TokenText(&'static str),
        /// An error status whose message is 60 KB with control characters in it.
        LongMessage,
    }

    #[derive(Debug)]
    struct FakeBroker {
        behaviour: Behaviour,
        seen: Arc<Mutex<Option<GetTokenRequest>>>,
    }

    #[tonic::async_trait]
    impl TokenService for FakeBroker {
        async fn get_token(
            &self,
            request: tonic::Request<GetTokenRequest>,
        ) -> Result<tonic::Response<GetTokenResponse>, tonic::Status> {
            let request = request.into_inner();
            let provider = request.provider.clone();
            *self.seen.lock().unwrap() = Some(request);
            match self.behaviour {
                Behaviour::Token => Ok(tonic::Response::new(GetTokenResponse {
                    token: "tok-123".into(),
                    expiration_time: Some(prost_types::Timestamp {
                        seconds: unix_now() + 3600,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
                Behaviour::NotFound => Err(broker_status(
                    tonic::Code::NotFound,
                    &format!("unknown provider {provider:?}\n(configured: eks, gke)"),
                    credbroker_proto::reason::UNKNOWN_PROVIDER,
                )),
                Behaviour::Hang => std::future::pending().await,
                Behaviour::TokenText(token) => Ok(tonic::Response::new(GetTokenResponse {
                    token: token.into(),
                    expiration_time: Some(prost_types::Timestamp {
                        seconds: unix_now() + 3600,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
                Behaviour::LongMessage => Err(tonic::Status::internal(format!(
                    "start\n\u{1b}[31m{}end",
                    "m".repeat(60_000)
                ))),
                Behaviour::Big => Ok(tonic::Response::new(GetTokenResponse {
                    client_certificate_data: "C".repeat(1_200_000),
                    client_key_data: "K".repeat(1_200_000),
                    expiration_time: Some(prost_types::Timestamp {
                        seconds: unix_now() + 3600,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
            }
        }
    }

    /// Serves a fake broker on a socket in a fresh temp dir (kept alive by the returned guard).
    fn start_fake(
        behaviour: Behaviour,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        Arc<Mutex<Option<GetTokenRequest>>>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("broker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let seen = Arc::new(Mutex::new(None));
        let service = TokenServiceServer::new(FakeBroker {
            behaviour,
            seen: seen.clone(),
        });
        tokio::spawn(tonic::transport::Server::builder().serve_with_incoming(
            service,
            tokio_stream::wrappers::UnixListenerStream::new(listener),
        ));
        (dir, socket, seen)
    }

    fn args(timeout: Duration) -> Args {
        Args {
            provider: "eks".into(),
            socket: None,
            timeout,
        }
    }

    #[tokio::test]
    async fn token_for_v1_with_cluster() {
        let (_dir, socket, seen) = start_fake(Behaviour::Token);
        let info = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "spec":{"interactive":false,"cluster":{"server":"https://c1:6443",
            "certificate-authority-data":"UEVN","config":{"clusterName":"c1","port":443}}}}"#;
        let out = call(args(DEFAULT_TIMEOUT), &socket, Some(info))
            .await
            .unwrap();

        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(doc["kind"], "ExecCredential");
        assert_eq!(doc["status"]["token"], "tok-123");
        let stamp = doc["status"]["expirationTimestamp"].as_str().unwrap();
        assert_eq!(
            stamp,
            credbroker_execcred::rfc3339_utc(unix_now() + 3600).unwrap()
        );

        let req = seen.lock().unwrap().clone().unwrap();
        assert_eq!(req.provider, "eks");
        let cluster = req.cluster.unwrap();
        assert_eq!(cluster.server, "https://c1:6443");
        assert_eq!(cluster.certificate_authority_data, b"PEM");
        // The config as client-go wrote it, never the lossy Struct.
        assert_eq!(cluster.config, None);
        assert_eq!(cluster.config_json, r#"{"clusterName":"c1","port":443}"#);
    }

    #[tokio::test]
    async fn token_for_v1beta1_and_absent_exec_info() {
        let (_dir, socket, seen) = start_fake(Behaviour::Token);
        let info = r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","spec":{}}"#;
        for exec_info in [Some(info), None] {
            let out = call(args(DEFAULT_TIMEOUT), &socket, exec_info)
                .await
                .unwrap();
            let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(doc["apiVersion"], "client.authentication.k8s.io/v1beta1");
            assert_eq!(doc["status"]["token"], "tok-123");
            assert_eq!(seen.lock().unwrap().clone().unwrap().cluster, None);
        }
    }

    /// Through tonic's own HTTP/2 server: a 300 KB request (CA data, over the initial
    /// windows, so sent as the server's WINDOW_UPDATEs allow) and a 2.4 MB answer (over the
    /// shim's 1 MiB receive window, which its WINDOW_UPDATEs reopen as it reads).
    #[tokio::test]
    async fn large_requests_and_answers_cross_whole() {
        let (_dir, socket, seen) = start_fake(Behaviour::Big);
        let ca = "Q".repeat(300_000);
        let info = format!(
            r#"{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "spec":{{"interactive":false,"cluster":{{"server":"https://c1:6443",
            "certificate-authority-data":"{ca}"}}}}}}"#
        );
        let out = call(args(DEFAULT_TIMEOUT), &socket, Some(&info))
            .await
            .unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            doc["status"]["clientCertificateData"]
                .as_str()
                .unwrap()
                .len(),
            1_200_000
        );
        assert_eq!(
            doc["status"]["clientKeyData"].as_str().unwrap().len(),
            1_200_000
        );
        let req = seen.lock().unwrap().clone().unwrap();
        assert_eq!(
            req.cluster.unwrap().certificate_authority_data.len(),
            225_000
        );
    }

    #[tokio::test]
    async fn not_found_names_the_provider_and_hints() {
        let (_dir, socket, _) = start_fake(Behaviour::NotFound);
        let f = call(args(DEFAULT_TIMEOUT), &socket, None)
            .await
            .unwrap_err();
        assert_eq!(
            f.line(),
            "credbroker-shim: the broker could not serve GetToken for provider \"eks\": NOT_FOUND: \
             unknown provider \"eks\"\\n(configured: eks, gke) (check --provider against \
             providers[].name in the broker config)"
        );
    }

    #[tokio::test]
    async fn hung_broker_times_out_within_the_bound() {
        let (_dir, socket, _) = start_fake(Behaviour::Hang);
        let started = Instant::now();
        let f = call(args(Duration::from_millis(300)), &socket, None)
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(f.what, "timed out waiting for the broker");
        assert_eq!(
            f.why,
            format!(
                "no answer from the broker at {} within 300ms",
                socket.display()
            )
        );
    }

    #[tokio::test]
    async fn silent_listener_times_out_within_the_bound() {
        // Accepts connections but never speaks HTTP/2 at all.
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let started = Instant::now();
        let f = call(args(Duration::from_millis(300)), &socket, None)
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(f.what, "timed out waiting for the broker");
    }

    #[tokio::test]
    async fn closed_connection_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("closing.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        let f = call(args(Duration::from_secs(5)), &socket, None)
            .await
            .unwrap_err();
        let line = f.line();
        // Depending on timing the handshake or the call sees the close first.
        assert!(
            f.what.starts_with("GetToken call to the broker at")
                || f.what.starts_with("cannot connect to the broker at"),
            "{line}"
        );
        assert!(!line.contains("transport error"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains(&socket.display().to_string()), "{line}");
    }

    #[tokio::test]
    async fn missing_socket_says_how_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nope.sock");
        let f = call(args(DEFAULT_TIMEOUT), &socket, None)
            .await
            .unwrap_err();
        assert_eq!(
            f.what,
            format!("cannot connect to the broker at {}", socket.display())
        );
        assert_eq!(f.why, "No such file or directory (os error 2)");
        assert!(f.hint.contains("CREDBROKER_SOCKET"), "{}", f.hint);
    }

    #[tokio::test]
    async fn bad_exec_info_fails_before_connecting() {
        let f = call(args(DEFAULT_TIMEOUT), Path::new("/nope.sock"), Some("{"))
            .await
            .unwrap_err();
        assert_eq!(f.what, "cannot use KUBERNETES_EXEC_INFO");
        assert!(f.why.starts_with("not valid JSON"), "{}", f.why);
    }

    /// A 60 KB `grpc-message` was printed whole on the one stderr line client-go copies into
    /// Kueue's log: it is cut to MAX_PEER_TEXT_BYTES, escaped, the cut marked.
    #[tokio::test]
    async fn a_long_status_message_is_cut_and_escaped() {
        let (_dir, socket, _) = start_fake(Behaviour::LongMessage);
        let f = call(args(DEFAULT_TIMEOUT), &socket, None)
            .await
            .unwrap_err();
        let line = f.line();
        assert!(
            line.len() < MAX_PEER_TEXT_BYTES + 500,
            "{} bytes",
            line.len()
        );
        assert!(
            f.why.starts_with("INTERNAL: start\\n\\u{1b}[31mmmm"),
            "{}",
            f.why
        );
        assert!(
            f.why.ends_with("m…(60014 bytes)"),
            "{}",
            &f.why[f.why.len() - 40..]
        );
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line}");
        // What the broker sends (at most 2048 bytes, already escaped) is shown whole.
        let mut whole = answer(&tonic::Status::internal("b".repeat(MAX_PEER_TEXT_BYTES)));
        assert_eq!(
            status_failure(&whole, "p").why.len(),
            "INTERNAL: ".len() + MAX_PEER_TEXT_BYTES
        );
        // A cut never splits an escape or a character.
        whole.message = format!("{}\u{1b}", "é".repeat(MAX_PEER_TEXT_BYTES / 2 - 2));
        let why = status_failure(&whole, "p").why;
        assert!(why.ends_with("é…(2045 bytes)"), "{why}");
    }

    /// A token client-go cannot put in an HTTP header was printed with exit 0: every request
    /// with it then failed in client-go. Refused; tab, spaces and UTF-8 pass.
    #[tokio::test]
    async fn a_token_no_http_header_can_carry_is_refused() {
        for (token, bad) in [
            ("s3cr\nt", "0x0a"),
            ("s3cr\rt", "0x0d"),
            ("s3cr\0", "0x00"),
            ("\u{1b}[2Js3cr", "0x1b"),
            ("s3cr\u{7f}", "0x7f"),
        ] {
            let token: &'static str = Box::leak(token.to_owned().into_boxed_str());
            let (_dir, socket, _) = start_fake(Behaviour::TokenText(token));
            let f = call(args(DEFAULT_TIMEOUT), &socket, None)
                .await
                .unwrap_err();
            assert_eq!(f.what, "unusable answer from the broker", "{token:?}");
            assert!(
                f.why
                    .contains(&format!("the token holds the control character {bad}")),
                "{token:?}: {}",
                f.why
            );
            assert!(
                !f.line().contains("s3cr"),
                "no part of the token: {}",
                f.line()
            );
        }
        for token in ["a\tb c", "jwt.ünï.côdé", "~!#$%&'*+-.^_`|"] {
            let token: &'static str = Box::leak(token.to_owned().into_boxed_str());
            let (_dir, socket, _) = start_fake(Behaviour::TokenText(token));
            let out = call(args(DEFAULT_TIMEOUT), &socket, None).await.unwrap();
            let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(doc["status"]["token"], token);
        }
    }

    /// Red-team finding: a 100 KB `--provider` was echoed whole on the one error line.
    #[test]
    fn error_lines_quote_arguments_cut_and_escaped() {
        let long = "p".repeat(100_000);
        assert_eq!(shown("eks"), "\"eks\"");
        let cut = shown(&long);
        assert!(cut.len() < 100 && cut.ends_with("…(100000 bytes)"), "{cut}");
        assert_eq!(shown("a\nb\u{1b}"), "\"a\\nb\\u{1b}\"");
        let e = parse_args(os(&["--provider=a", &format!("--{long}=x")])).unwrap_err();
        assert!(e.line().len() < 300, "{}", e.line());
        let status = tonic::Status::not_found("no such provider");
        let f = status_failure(&answer(&status), &long);
        let line = f.line();
        assert!(
            line.len() < 500 && line.contains("…(100000 bytes)"),
            "{line}"
        );
    }
}
