//! Who is asking: the process that ran the shim and the exec config it ran it for, so the
//! broker can tell client-go asking again after a 401 (the same process, the same exec
//! config, before the come-back time it was given) from a new process asking for the first
//! time. Best effort: when `/proc` cannot say, the request goes without it and is served as
//! an old shim's would be.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt as _;

use credbroker_proto::v1::Caller;
use sha2::{Digest as _, Sha256};

/// What the shim reads of a `/proc/<pid>/stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 1: the process id, as the `/proc` mount's pid namespace numbers it.
    pub pid: u32,
    /// Field 4: the parent's process id.
    pub ppid: u32,
    /// Field 20: the number of threads.
    pub threads: u64,
    /// Field 22: the start time in clock ticks since boot.
    pub start_time: u64,
}

/// Parses a `/proc/<pid>/stat` line. The second field, the command name in parentheses, may
/// itself hold spaces and parentheses, so the fields are counted from the text after the
/// last `)`: field 3 (the state) is the first one there.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let (head, rest) = line.rsplit_once(')')?;
    let (pid, _comm) = head.split_once(" (")?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // Field N is at index N - 3 after the command name.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        pid: pid.parse().ok()?,
        ppid: fields.get(4 - 3)?.parse().ok()?,
        threads: field(20)?,
        start_time: field(22)?,
    })
}

/// SHA-256 in lowercase hex of the program that ran the shim and what keys client-go's
/// authenticator: the parent's executable (`/proc/<ppid>/exe`), the arguments, then
/// `KUBERNETES_EXEC_INFO`, then the environment sorted by name. Each piece is length-prefixed,
/// so no two different inputs hash the same text.
///
/// The executable is there because `execve` keeps the pid and the start time: Google Cloud
/// SDK's `kubectl` is a dispatcher that asks the server's version (running the plugin once)
/// and then execs the matching `kubectl.1.NN` in the same process, which runs the plugin
/// again with the same environment. Without it that second run is the same caller asking
/// again before its come-back time, a re-ask the broker must check; with it, a new caller.
/// client-go asking again after a 401 is the same program, so its re-asks keep their digest.
pub fn config_digest(
    exe: &[u8],
    args: &[OsString],
    exec_info: Option<&str>,
    mut env: Vec<(OsString, OsString)>,
) -> String {
    env.sort();
    let mut h = Sha256::new();
    let mut put = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    put(b"exe");
    put(exe);
    put(b"args");
    for a in args {
        put(a.as_bytes());
    }
    put(b"exec-info");
    put(exec_info.unwrap_or_default().as_bytes());
    put(b"env");
    for (k, v) in &env {
        put(k.as_bytes());
        put(v.as_bytes());
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// The caller of this run, from the parent's `/proc/<ppid>/stat`. `None` when it cannot be
/// read (no `/proc`, `hidepid`), when `/proc` is not this process's pid namespace's (its
/// `self` links to another pid: the parent's entry there would be another process; the link
/// is read rather than `/proc/self/stat`, which the kernel formats for 10 µs of a hit), or
/// when the parent has a single thread: every Go program (client-go) runs several, while a
/// shell or script that runs the shim by hand again and again is not client-go retrying
/// after a 401.
pub fn this_caller(exec_info: Option<&str>) -> Option<Caller> {
    if own_pid_in_proc()? != std::process::id() {
        return None;
    }
    caller_of(std::os::unix::process::parent_id(), exec_info)
}

/// The longest `/proc/<pid>/stat` line read: 52 numeric fields and a command name of at most
/// 64 bytes (a kernel thread's) stay well under it.
const STAT_MAX: usize = 2048;

/// `/proc/<pid>/stat` in one read (and the one that sees its end), where
/// `fs::read_to_string` asks for the size (0 for a `/proc` file) and grows its buffer from
/// 32 bytes: 7 system calls instead of 2. `None` when unreadable or longer than [`STAT_MAX`].
fn read_stat(pid: u32) -> Option<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut buf = vec![0u8; STAT_MAX];
    let mut len = 0;
    loop {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if len == STAT_MAX {
            return None;
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// This process's pid as the `/proc` mount numbers it: the target of its `self` link.
fn own_pid_in_proc() -> Option<u32> {
    std::fs::read_link("/proc/self")
        .ok()?
        .to_str()?
        .parse()
        .ok()
}

/// The caller of this run if process `pid` ran it.
fn caller_of(pid: u32, exec_info: Option<&str>) -> Option<Caller> {
    let stat = read_stat(pid)?;
    let parent = parse_stat(&stat)?;
    if parent.pid != pid || parent.threads < 2 || pid == 0 {
        return None;
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    // Unreadable (another uid without ptrace access): the digest still covers the rest.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    Some(Caller {
        pid,
        start_time: parent.start_time,
        config_digest: config_digest(
            exe.as_os_str().as_bytes(),
            &args,
            exec_info,
            std::env::vars_os().collect(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line with `comm` in its parentheses, 13 threads, start time 98765.
    fn stat(comm: &str) -> String {
        format!(
            "4242 ({comm}) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 13 0 98765 123456789 1000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
        )
    }

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let want = Stat {
            pid: 4242,
            ppid: 1,
            threads: 13,
            start_time: 98765,
        };
        for comm in [
            "kubectl",
            "my prog",
            "a) S 1 2 3 (b",
            ")",
            "((",
            "x 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
        ] {
            assert_eq!(parse_stat(&stat(comm)), Some(want), "{comm:?}");
        }
    }

    #[test]
    fn broken_stat_lines_give_nothing() {
        for line in [
            "",
            "4242 kubectl S 1",
            "x (kubectl) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 13 0 98765",
            "4242 (kubectl) S 1 2 3",
            "4242 (kubectl) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 x 0 98765",
            "4242 (kubectl) S 1 4242 4242 0 -1 4194560 1000 0 0 0 5 3 0 0 20 0 13 0 -5",
        ] {
            assert_eq!(parse_stat(line), None, "{line:?}");
        }
    }

    #[test]
    fn the_digest_follows_the_exec_config_not_the_environment_order() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let env = |e: &[(&str, &str)]| {
            e.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect::<Vec<_>>()
        };
        let base = config_digest(
            b"/usr/bin/kubectl",
            &args(&["shim", "--provider", "p"]),
            Some("{}"),
            env(&[("A", "1"), ("B", "2")]),
        );
        assert_eq!(base.len(), 64);
        assert!(
            base.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let same = config_digest(
            b"/usr/bin/kubectl",
            &args(&["shim", "--provider", "p"]),
            Some("{}"),
            env(&[("B", "2"), ("A", "1")]),
        );
        assert_eq!(base, same, "the environment is sorted");
        for other in [
            config_digest(
                b"/usr/bin/kubectl",
                &args(&["shim", "--provider", "q"]),
                Some("{}"),
                env(&[("A", "1"), ("B", "2")]),
            ),
            config_digest(
                b"/usr/bin/kubectl",
                &args(&["shim", "--provider", "p"]),
                Some("{\"x\":1}"),
                env(&[("A", "1"), ("B", "2")]),
            ),
            config_digest(
                b"/usr/bin/kubectl",
                &args(&["shim", "--provider", "p"]),
                Some("{}"),
                env(&[("A", "1"), ("B", "3")]),
            ),
            // Another program in the same process (`execve` keeps pid and start time).
            config_digest(
                b"/usr/bin/kubectl.1.31",
                &args(&["shim", "--provider", "p"]),
                Some("{}"),
                env(&[("A", "1"), ("B", "2")]),
            ),
            // Moving text between pieces changes the digest (length prefixes).
            config_digest(
                b"/usr/bin/kubectl",
                &args(&["shim", "--provider", "p"]),
                Some("{}"),
                env(&[("A", "1B"), ("", "2")]),
            ),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_multi_threaded_process_is_a_caller_with_its_start_time() {
        // A second thread for the while, so this process looks like client-go.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || rx.recv());
        let caller = caller_of(std::process::id(), Some("{}")).expect("a caller from /proc");
        drop(tx);
        let _ = other.join();
        assert_eq!(caller.pid, std::process::id());
        let own = std::fs::read_to_string(format!("/proc/{}/stat", caller.pid)).unwrap();
        assert_eq!(
            Some(caller.start_time),
            parse_stat(&own).map(|s| s.start_time)
        );
        assert_eq!(caller.config_digest.len(), 64);
        // Read whole, as `fs::read_to_string` reads it (the times in it move between reads;
        // the fields the caller takes and the line's shape do not).
        let once = read_stat(caller.pid).expect("read_stat");
        let fields = |line: &str| line.split_ascii_whitespace().count();
        assert!(once.ends_with('\n'), "{once:?}");
        assert_eq!(fields(&once), fields(&own));
        let (a, b) = (parse_stat(&once).unwrap(), parse_stat(&own).unwrap());
        assert_eq!((a.pid, a.ppid, a.start_time), (b.pid, b.ppid, b.start_time));
        // This test's own run: /proc/self agrees with the process id (the same pid namespace).
        assert_eq!(own_pid_in_proc(), Some(std::process::id()));
    }
}
