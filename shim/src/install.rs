//! `credbroker-shim install DIR [--name NAME]`: the shim copies its own executable into DIR,
//! so an init container of the credbroker image can fill the emptyDir Kueue's manager runs
//! the shim from, with no other image and no `cp`.
//!
//! The copy is atomic: `/proc/self/exe` is written to `DIR/.NAME.tmp-<pid>` (created with
//! `O_EXCL`, so never through a symlink), flushed with fsync, made mode 0755, then renamed over
//! `DIR/NAME`, and the directory is fsynced. A reader of `DIR/NAME` sees the old file or the
//! whole new one, never a part. On any failure the temporary file is removed.
//!
//! Only an earlier copy of the shim is replaced: a regular file that starts with the ELF magic
//! and holds [`MARKER`], a string compiled into every shim since `install` exists. Anything
//! else at `DIR/NAME` (another program, a symlink, a directory) is refused, naming the path.
//! The check is against a wrong DIR or NAME, not against another writer of DIR racing this one:
//! `rename(2)` replaces whatever is there at that moment. The file is read, never run.
//!
//! std only: the shim's size is benchmarked.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::{Failure, shown};

/// What the shim calls itself in DIR unless `--name` says otherwise.
pub const DEFAULT_NAME: &str = "credbroker-shim";

/// Usage of the subcommand, the hint of its argument errors.
pub const USAGE: &str = "credbroker-shim install DIR [--name NAME]";

/// The bytes that make a file "an earlier copy of the shim". Never change them: an installed
/// shim of any later version must recognise every earlier one. A static read through
/// `black_box`, so the bytes stay whole in the binary (a comparison against a literal could be
/// compiled into immediates and leave no copy to find).
pub static MARKER: [u8; 57] = *b"\0credbroker-shim self-install marker, format 1; 7d3f1c2a\0";

/// The mode of the installed file: what client-go needs to exec it, for any uid.
const MODE: u32 = 0o755;

/// How much bigger than this shim an earlier copy at `DIR/NAME` may be: a debug build of the
/// shim is under 6 times its static release build (7.9 MB against 1.4 MB), and a release grows
/// by far less than that between versions. A bigger file is not a shim and is refused by its
/// size alone, before any of it is read (a 1 GiB sparse file took 5 s to scan).
const SIZE_MARGIN: u64 = 8;

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

/// Where this executable is read from: the kernel's link to the running image, whatever path
/// or argv[0] it was started by.
const SELF_EXE: &str = "/proc/self/exe";

/// The options of `install`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallArgs {
    pub dir: PathBuf,
    pub name: String,
}

/// A command-line mistake of `install`, with its usage as the hint.
fn usage_error(why: impl Into<String>) -> Failure {
    Failure::new(
        "invalid arguments",
        why,
        format!("usage: {USAGE}; see --help"),
    )
}

/// Parses the arguments after `install`: one DIR, `--name NAME` or `--name=NAME` once.
pub fn parse_args(args: Vec<String>) -> Result<InstallArgs, Failure> {
    let (mut dir, mut name) = (None, None);
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        match flag.as_str() {
            "--name" => {
                let value = match inline.or_else(|| rest.next()) {
                    Some(v) if !v.is_empty() => v,
                    _ => return Err(usage_error("--name needs a non-empty value")),
                };
                if name.replace(value).is_some() {
                    return Err(usage_error("--name given more than once"));
                }
            }
            f if f.starts_with('-') => {
                return Err(usage_error(format!(
                    "install: unknown flag {} (install takes only DIR and --name)",
                    shown(f)
                )));
            }
            _ if dir.is_some() => {
                return Err(usage_error(format!(
                    "install: unexpected argument {} (one DIR only)",
                    shown(&flag)
                )));
            }
            _ if flag.is_empty() => return Err(usage_error("install: DIR is empty")),
            _ => dir = Some(flag),
        }
    }
    let dir = dir.ok_or_else(|| usage_error("install needs DIR, the directory to copy into"))?;
    let name = name.unwrap_or_else(|| DEFAULT_NAME.to_owned());
    if name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(usage_error(format!(
            "--name {}: a file name, without '/'",
            shown(&name)
        )));
    }
    Ok(InstallArgs {
        dir: PathBuf::from(dir),
        name,
    })
}

/// What [`install`] did, for the one line it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `DIR/NAME` was absent and now is this shim.
    Installed { path: PathBuf, bytes: u64 },
    /// `DIR/NAME` was an earlier copy and now is this shim.
    Replaced { path: PathBuf, bytes: u64 },
    /// `DIR/NAME` is the very file this process runs from.
    AlreadyThere { path: PathBuf },
}

impl Outcome {
    /// The line printed on stdout.
    pub fn line(&self) -> String {
        let text = match self {
            Outcome::Installed { path, bytes } => {
                format!(
                    "credbroker-shim: installed {} ({bytes} bytes)",
                    path.display()
                )
            }
            Outcome::Replaced { path, bytes } => format!(
                "credbroker-shim: replaced an earlier copy at {} ({bytes} bytes)",
                path.display()
            ),
            Outcome::AlreadyThere { path } => format!(
                "credbroker-shim: {} is this executable already; nothing to do",
                path.display()
            ),
        };
        credbroker_proto::text::controls_escaped(&text).into_owned()
    }
}

/// Installs the running executable as `args.dir/args.name`.
pub fn install(args: &InstallArgs) -> Result<Outcome, Failure> {
    install_from(Path::new(SELF_EXE), args)
}

/// [`install`] with the source given: `/proc/self/exe` in the binary, a built shim in tests.
pub fn install_from(source: &Path, args: &InstallArgs) -> Result<Outcome, Failure> {
    let dir = &args.dir;
    let dest = dir.join(&args.name);
    let into = || format!("cannot install into {}", dir.display());

    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(Failure::new(
                into(),
                "not a directory",
                "DIR is the directory to put the shim in: the shared volume's mount",
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(Failure::new(
                into(),
                "no such directory",
                "create it, or mount the volume the shim goes into there",
            ));
        }
        Err(e) => {
            return Err(Failure::new(
                into(),
                e.to_string(),
                "this user must reach DIR: check its and its parents' permissions",
            ));
        }
    }

    let mut src = File::open(source).map_err(|e| {
        Failure::new(
            "cannot read this executable",
            format!("{}: {e}", source.display()),
            "install copies the running shim and needs /proc mounted, as every container has",
        )
    })?;
    let src_meta = src.metadata().map_err(|e| {
        Failure::new(
            "cannot read this executable",
            format!("{}: {e}", source.display()),
            "install needs /proc mounted",
        )
    })?;

    let replacing = match check_destination(&dest, src_meta.len())? {
        Existing::Nothing => false,
        Existing::EarlierCopy { dev, ino } if (dev, ino) == (src_meta.dev(), src_meta.ino()) => {
            return Ok(Outcome::AlreadyThere { path: dest });
        }
        Existing::EarlierCopy { .. } => true,
    };

    let tmp = dir.join(format!(".{}.tmp-{}", args.name, std::process::id()));
    let mut out = create_temp(&tmp, dir)?;
    let guard = RemoveOnDrop(Some(tmp.clone()));
    let write_failure = |e: std::io::Error| {
        Failure::new(
            format!("cannot copy {} to {}", source.display(), tmp.display()),
            e.to_string(),
            "is the volume full (an emptyDir's sizeLimit) or read-only?",
        )
    };
    let bytes = copy(&mut src, &mut out).map_err(write_failure)?;
    if bytes != src_meta.len() {
        return Err(write_failure(std::io::Error::other(format!(
            "copied {bytes} bytes of {}'s {}",
            source.display(),
            src_meta.len()
        ))));
    }
    out.set_permissions(std::fs::Permissions::from_mode(MODE))
        .map_err(write_failure)?;
    out.sync_all().map_err(write_failure)?;
    drop(out);

    std::fs::rename(&tmp, &dest).map_err(|e| {
        Failure::new(
            format!("cannot rename {} to {}", tmp.display(), dest.display()),
            e.to_string(),
            "check that nothing else writes into DIR",
        )
    })?;
    guard.disarm();
    // The rename is durable once the directory is: fsync it. Some filesystems cannot fsync a
    // directory (EINVAL); the file itself is already on disk there.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all())
        && e.kind() != ErrorKind::InvalidInput
    {
        return Err(Failure::new(
            format!("cannot sync {}", dir.display()),
            e.to_string(),
            "the shim is in place but may not survive a crash; run install again",
        ));
    }
    Ok(if replacing {
        Outcome::Replaced { path: dest, bytes }
    } else {
        Outcome::Installed { path: dest, bytes }
    })
}

/// Copies `src` to `out` through one buffer: `std::io::copy` between files brings its
/// copy_file_range/sendfile paths into the binary (4 KB of the shim) for a 2 MB copy once
/// per pod.
fn copy(src: &mut File, out: &mut File) -> std::io::Result<u64> {
    use std::io::Write as _;
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// What is at the destination now.
#[derive(Debug)]
enum Existing {
    Nothing,
    EarlierCopy { dev: u64, ino: u64 },
}

/// Looks at `dest` without following a symlink; refuses anything but an earlier shim, and
/// anything over [`SIZE_MARGIN`] times `own_size` (this shim's) unread.
fn check_destination(dest: &Path, own_size: u64) -> Result<Existing, Failure> {
    let refuse = |why: String| {
        Failure::new(
            format!("refusing to replace {}", dest.display()),
            why,
            "install replaces only an earlier credbroker-shim; remove it, or choose another \
             DIR or --name",
        )
    };
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Existing::Nothing),
        Err(e) => {
            return Err(Failure::new(
                format!("cannot look at {}", dest.display()),
                e.to_string(),
                "check DIR's permissions",
            ));
        }
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(refuse("it is a symbolic link".to_owned()));
    }
    if kind.is_dir() {
        return Err(refuse("it is a directory".to_owned()));
    }
    if !kind.is_file() {
        return Err(refuse("it is not a regular file".to_owned()));
    }
    let most = own_size.saturating_mul(SIZE_MARGIN);
    if meta.len() > most {
        return Err(refuse(format!(
            "it is not an earlier credbroker-shim: {} bytes, more than {SIZE_MARGIN} times this \
             shim's {own_size}",
            meta.len()
        )));
    }
    let mut file = File::open(dest).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    // The file opened is the one looked at (not swapped for another since).
    let opened = file
        .metadata()
        .map_err(|e| refuse(format!("cannot read it: {e}")))?;
    if (opened.dev(), opened.ino()) != (meta.dev(), meta.ino()) || !opened.is_file() {
        return Err(refuse("it changed while being checked".to_owned()));
    }
    match is_earlier_copy(&mut file, std::hint::black_box(&MARKER), most) {
        Ok(true) => Ok(Existing::EarlierCopy {
            dev: meta.dev(),
            ino: meta.ino(),
        }),
        Ok(false) => Err(refuse(
            "it is not an earlier credbroker-shim (no credbroker-shim marker in it)".to_owned(),
        )),
        Err(e) => Err(refuse(format!("cannot read it: {e}"))),
    }
}

/// Whether `file` starts with the ELF magic and holds `marker` in its first `limit` bytes
/// (a file that grew since its size was checked is read no further), read in chunks (a marker
/// across two chunks is found).
fn is_earlier_copy(file: &mut File, marker: &[u8], limit: u64) -> std::io::Result<bool> {
    const CHUNK: usize = 64 << 10;
    let mut buf = vec![0u8; CHUNK + marker.len()];
    let mut kept = 0; // bytes carried over from the previous chunk
    let mut first = true;
    let mut reader = file.take(limit);
    loop {
        let n = match reader.read(&mut buf[kept..]) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let have = kept + n;
        if first {
            // A short first read still has the magic or is too small to be a shim.
            if have < ELF_MAGIC.len() {
                kept = have;
                continue;
            }
            if &buf[..ELF_MAGIC.len()] != ELF_MAGIC {
                return Ok(false);
            }
            first = false;
        }
        if contains(&buf[..have], marker) {
            return Ok(true);
        }
        kept = (marker.len() - 1).min(have);
        buf.copy_within(have - kept..have, 0);
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&head, tail)) = needle.split_first() else {
        return true;
    };
    let mut at = 0;
    while let Some(i) = haystack[at..].iter().position(|&b| b == head) {
        let start = at + i;
        let end = start + needle.len();
        if end > haystack.len() {
            return false;
        }
        if &haystack[start + 1..end] == tail {
            return true;
        }
        at = start + 1;
    }
    false
}

/// Creates the temporary file, `O_EXCL` (never through a symlink), mode 0700 until written.
/// A leftover of a killed run with the same pid is removed first: an init container is pid 1
/// on every restart, and the emptyDir keeps what the last attempt left.
fn create_temp(tmp: &Path, dir: &Path) -> Result<File, Failure> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(tmp)
    };
    let result = match open() {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && is_leftover(tmp) => {
            std::fs::remove_file(tmp).and_then(|()| open())
        }
        other => other,
    };
    result.map_err(|e| {
        let hint = match e.kind() {
            ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => {
                "DIR must be writable by this user: mount a writable volume there, an emptyDir"
            }
            ErrorKind::AlreadyExists => "something else of that name is in DIR; remove it",
            _ => "check DIR",
        };
        Failure::new(
            format!("cannot install into {}", dir.display()),
            format!("cannot create {}: {e}", tmp.display()),
            hint,
        )
    })
}

/// A leftover temporary file is a regular file or a symlink (removing either follows nothing).
fn is_leftover(tmp: &Path) -> bool {
    std::fs::symlink_metadata(tmp).is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
}

/// Removes the temporary file unless the rename took it.
#[derive(Debug)]
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a built shim: the ELF magic, then `body`, the marker, more bytes.
    fn fake_shim(body: &[u8]) -> Vec<u8> {
        let mut bytes = ELF_MAGIC.to_vec();
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(&MARKER);
        bytes.extend_from_slice(b"rest of the binary");
        bytes
    }

    fn write(path: &Path, bytes: &[u8], mode: u32) {
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A directory with a source shim in it, and an empty DIR to install into.
    struct Setup {
        _tmp: tempfile::TempDir,
        source: PathBuf,
        dir: PathBuf,
        bytes: Vec<u8>,
    }

    fn setup() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source-shim");
        let bytes = fake_shim(b"this build");
        write(&source, &bytes, 0o700);
        let dir = tmp.path().join("emptydir");
        std::fs::create_dir(&dir).unwrap();
        Setup {
            _tmp: tmp,
            source,
            dir,
            bytes,
        }
    }

    impl Setup {
        fn args(&self) -> InstallArgs {
            InstallArgs {
                dir: self.dir.clone(),
                name: DEFAULT_NAME.to_owned(),
            }
        }

        fn dest(&self) -> PathBuf {
            self.dir.join(DEFAULT_NAME)
        }

        fn install(&self) -> Result<Outcome, Failure> {
            install_from(&self.source, &self.args())
        }

        /// The names in DIR, sorted: no temporary file may be among them.
        fn entries(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn os(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn installs_into_a_fresh_dir_with_mode_0755() {
        let s = setup();
        let done = s.install().unwrap();
        assert_eq!(
            done,
            Outcome::Installed {
                path: s.dest(),
                bytes: s.bytes.len() as u64
            }
        );
        assert_eq!(std::fs::read(s.dest()).unwrap(), s.bytes);
        assert_eq!(mode(&s.dest()), 0o755, "whatever the source's mode (0700)");
        assert_eq!(s.entries(), [DEFAULT_NAME], "no temporary file left");
        assert_eq!(
            done.line(),
            format!(
                "credbroker-shim: installed {} ({} bytes)",
                s.dest().display(),
                s.bytes.len()
            )
        );
    }

    #[test]
    fn replaces_an_earlier_copy() {
        let s = setup();
        let earlier = fake_shim(b"an earlier build, of another length");
        write(&s.dest(), &earlier, 0o555);
        let done = s.install().unwrap();
        assert!(matches!(done, Outcome::Replaced { .. }), "{done:?}");
        assert_eq!(std::fs::read(s.dest()).unwrap(), s.bytes);
        assert_eq!(mode(&s.dest()), 0o755);
        assert_eq!(s.entries(), [DEFAULT_NAME]);
        // And again: the installed file is an earlier copy for the next run.
        assert!(matches!(s.install().unwrap(), Outcome::Replaced { .. }));
    }

    #[test]
    fn installing_a_file_over_itself_changes_nothing() {
        let s = setup();
        s.install().unwrap();
        let done = install_from(&s.dest(), &s.args()).unwrap();
        assert_eq!(done, Outcome::AlreadyThere { path: s.dest() });
        assert_eq!(std::fs::read(s.dest()).unwrap(), s.bytes);
    }

    #[test]
    fn honours_name() {
        let s = setup();
        let args = InstallArgs {
            dir: s.dir.clone(),
            name: "kubectl-credbroker".to_owned(),
        };
        install_from(&s.source, &args).unwrap();
        assert_eq!(s.entries(), ["kubectl-credbroker"]);
    }

    /// Refused, naming the path, with DIR left exactly as it was.
    fn assert_refused(s: &Setup, why: &str) {
        let before = s.entries();
        let f = s.install().unwrap_err();
        let line = f.line();
        assert_eq!(
            f.what,
            format!("refusing to replace {}", s.dest().display()),
            "{line}"
        );
        assert!(f.why.contains(why), "{line}");
        assert!(f.hint.contains("only an earlier credbroker-shim"), "{line}");
        assert_eq!(s.entries(), before, "nothing added or removed: {line}");
    }

    #[test]
    fn refuses_a_foreign_file() {
        let cases: [(&str, Vec<u8>); 4] = [
            ("a script", b"#!/bin/sh\necho hi\n".to_vec()),
            ("an ELF without the marker", {
                let mut b = ELF_MAGIC.to_vec();
                b.extend_from_slice(&[0; 4096]);
                b
            }),
            ("the marker without the ELF magic", {
                let mut b = b"docs quoting the marker: ".to_vec();
                b.extend_from_slice(&MARKER);
                b
            }),
            ("an empty file", Vec::new()),
        ];
        for (case, bytes) in cases {
            let s = setup();
            write(&s.dest(), &bytes, 0o755);
            assert_refused(&s, "not an earlier credbroker-shim");
            assert_eq!(std::fs::read(s.dest()).unwrap(), bytes, "{case}: untouched");
        }
    }

    /// A 1 GiB sparse file took 5 s to scan before it was refused; now its size refuses it
    /// unread, and an earlier copy up to SIZE_MARGIN times this shim's size is still replaced.
    #[test]
    fn refuses_a_file_far_bigger_than_a_shim_by_its_size() {
        let s = setup();
        let mut huge = File::create(s.dest()).unwrap();
        std::io::Write::write_all(&mut huge, ELF_MAGIC).unwrap();
        huge.set_len(1 << 30).unwrap();
        drop(huge);
        let started = std::time::Instant::now();
        assert_refused(&s, "more than 8 times this shim's");
        assert!(
            started.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(std::fs::metadata(s.dest()).unwrap().len(), 1 << 30);
        // Even with the ELF magic and the marker at its start.
        let mut bytes = fake_shim(b"");
        bytes.resize(s.bytes.len() * SIZE_MARGIN as usize + 1, 0);
        write(&s.dest(), &bytes, 0o755);
        assert_refused(&s, "more than 8 times this shim's");
        // At the margin it is read, and replaced.
        bytes.truncate(s.bytes.len() * SIZE_MARGIN as usize);
        write(&s.dest(), &bytes, 0o755);
        assert!(matches!(s.install().unwrap(), Outcome::Replaced { .. }));
    }

    #[test]
    fn refuses_a_symlink_even_to_an_earlier_copy() {
        let s = setup();
        let target = s.dir.parent().unwrap().join("elsewhere");
        write(&target, &fake_shim(b"old"), 0o755);
        std::os::unix::fs::symlink(&target, s.dest()).unwrap();
        assert_refused(&s, "symbolic link");
        assert!(std::fs::symlink_metadata(s.dest()).unwrap().is_symlink());
        // A dangling one too.
        std::fs::remove_file(&target).unwrap();
        assert_refused(&s, "symbolic link");
    }

    #[test]
    fn refuses_a_directory_or_a_fifo() {
        let s = setup();
        std::fs::create_dir(s.dest()).unwrap();
        assert_refused(&s, "is a directory");
        std::fs::remove_dir(s.dest()).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(s.dest()).status();
        if fifo.is_ok_and(|st| st.success()) {
            assert_refused(&s, "not a regular file");
        }
    }

    #[test]
    fn missing_dir_and_a_file_as_dir() {
        let s = setup();
        let missing = InstallArgs {
            dir: s.dir.join("nope"),
            name: DEFAULT_NAME.to_owned(),
        };
        let f = install_from(&s.source, &missing).unwrap_err();
        assert_eq!(
            f.line(),
            format!(
                "credbroker-shim: cannot install into {}: no such directory (create it, or \
                 mount the volume the shim goes into there)",
                missing.dir.display()
            )
        );
        let file = InstallArgs {
            dir: s.source.clone(),
            name: DEFAULT_NAME.to_owned(),
        };
        let f = install_from(&s.source, &file).unwrap_err();
        assert_eq!(
            f.what,
            format!("cannot install into {}", s.source.display())
        );
        assert_eq!(f.why, "not a directory");
    }

    #[test]
    fn a_failed_copy_leaves_no_temporary_file() {
        let s = setup();
        // A directory opens for reading but fails at the first read (EISDIR): the temporary
        // file exists by then and must be removed.
        let f = install_from(&s.dir, &s.args()).unwrap_err();
        assert!(f.what.starts_with("cannot copy "), "{}", f.line());
        assert!(f.what.contains(".credbroker-shim.tmp-"), "{}", f.line());
        assert!(s.entries().is_empty(), "{:?}", s.entries());
        // An earlier copy survives a failed replacement whole.
        let earlier = fake_shim(b"old");
        write(&s.dest(), &earlier, 0o755);
        install_from(&s.dir, &s.args()).unwrap_err();
        assert_eq!(s.entries(), [DEFAULT_NAME]);
        assert_eq!(std::fs::read(s.dest()).unwrap(), earlier);
        // A missing source fails before anything is created.
        let f = install_from(&s.dir.join("nope"), &s.args()).unwrap_err();
        assert_eq!(f.what, "cannot read this executable", "{}", f.line());
        assert_eq!(s.entries(), [DEFAULT_NAME]);
    }

    #[test]
    fn a_leftover_of_a_killed_run_is_replaced() {
        let s = setup();
        let leftover = s
            .dir
            .join(format!(".{DEFAULT_NAME}.tmp-{}", std::process::id()));
        write(&leftover, b"half a shim", 0o700);
        s.install().unwrap();
        assert_eq!(s.entries(), [DEFAULT_NAME]);
        // Never a directory of that name, though.
        std::fs::create_dir(&leftover).unwrap();
        let f = install_from(&s.source, &s.args()).unwrap_err();
        assert!(f.why.contains("File exists"), "{}", f.line());
        assert!(leftover.is_dir());
    }

    #[test]
    fn finds_the_marker_across_chunks_and_only_after_the_magic() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f");
        for offset in [0, 1, (64 << 10) - 30, 64 << 10, (64 << 10) + 1, 200_000] {
            let mut bytes = ELF_MAGIC.to_vec();
            bytes.resize(4 + offset, b'x');
            bytes.extend_from_slice(&MARKER);
            bytes.extend_from_slice(&[b'y'; 100]);
            write(&path, &bytes, 0o644);
            let mut f = File::open(&path).unwrap();
            assert!(
                is_earlier_copy(&mut f, &MARKER, u64::MAX).unwrap(),
                "offset {offset}"
            );
            // Cut one byte short of the whole marker: not found.
            bytes.truncate(4 + offset + MARKER.len() - 1);
            write(&path, &bytes, 0o644);
            let mut f = File::open(&path).unwrap();
            assert!(
                !is_earlier_copy(&mut f, &MARKER, u64::MAX).unwrap(),
                "offset {offset}"
            );
        }
    }

    /// The marker is in what this crate compiles (the unit-test binary here; the shipped
    /// shim is checked in tests/tests/shim_install.rs).
    #[test]
    fn this_binary_carries_the_marker() {
        let mut me = File::open(SELF_EXE).unwrap();
        assert!(is_earlier_copy(&mut me, &MARKER, u64::MAX).unwrap());
    }

    #[test]
    fn args() {
        let ok = |args: &[&str]| parse_args(os(args)).unwrap();
        assert_eq!(
            ok(&["/install/bin"]),
            InstallArgs {
                dir: "/install/bin".into(),
                name: DEFAULT_NAME.into()
            }
        );
        for args in [
            &["/d", "--name", "n"][..],
            &["--name", "n", "/d"],
            &["--name=n", "/d"],
        ] {
            assert_eq!(
                ok(args),
                InstallArgs {
                    dir: "/d".into(),
                    name: "n".into()
                },
                "{args:?}"
            );
        }
        let bad = [
            (&[][..], "install needs DIR"),
            (&[""], "DIR is empty"),
            (&["/a", "/b"], "unexpected argument \"/b\""),
            (&["/a", "--provider", "p"], "unknown flag \"--provider\""),
            (&["/a", "--name"], "--name needs a non-empty value"),
            (&["/a", "--name="], "--name needs a non-empty value"),
            (&["/a", "--name=x", "--name=y"], "given more than once"),
            (&["/a", "--name", "b/c"], "without '/'"),
            (&["/a", "--name", ".."], "without '/'"),
        ];
        for (args, want) in bad {
            let f = parse_args(os(args)).unwrap_err();
            assert_eq!(f.what, "invalid arguments");
            assert!(f.why.contains(want), "{args:?}: {}", f.why);
            assert!(f.hint.contains(USAGE), "{args:?}: {}", f.hint);
        }
    }
}
