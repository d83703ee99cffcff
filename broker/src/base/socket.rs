//! The broker's Unix socket: created with the configured mode, never replacing anything but
//! a stale socket, and removed on shutdown only if it is still ours.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use std::time::{Duration, SystemTime};

use nix::sys::stat::{Mode, umask};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// How often the keeper checks that the socket file is still ours: one `stat` a second
/// costs nothing, and a socket someone deleted is back within a second.
pub const SOCKET_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Pause after a failed accept: errors like EMFILE last until a descriptor frees up, and
/// retrying at once would spin a core; a tenth of a second is unnoticeable to callers.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create the socket directory {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} exists and is not a socket; refusing to replace it (remove it or choose another socket.path)"
    )]
    NotASocket { path: PathBuf },
    #[error("another broker is already listening on {path}; stop it or choose another socket.path")]
    InUse { path: PathBuf },
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove the stale socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} was replaced while the broker was creating its socket; check what else writes to that directory"
    )]
    Replaced { path: PathBuf },
}

/// Removes the socket file when dropped, if the file there is still the one we created.
#[derive(Debug)]
pub struct SocketGuard {
    path: PathBuf,
    inode: (u64, u64, Option<SystemTime>),
}

impl SocketGuard {
    /// Whether the file at the path is still the socket we created.
    pub fn in_place(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|meta| identity(&meta) == self.inode)
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && identity(&meta) == self.inode
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Which file: device and inode. Not its mode or times, which anyone allowed to write the
/// socket can change with `chmod` or `touch`. tmpfs reuses an inode number at once, so the
/// creation time (statx btime, which neither of those can set) tells our socket from a later
/// one at the same inode where the filesystem records it.
fn identity(meta: &std::fs::Metadata) -> (u64, u64, Option<SystemTime>) {
    (meta.dev(), meta.ino(), meta.created().ok())
}

/// Serializes the umask switch around `bind`.
static UMASK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Missing parents of the socket get rwxr-xr-x whatever the process umask (a umask of 000
/// would otherwise make them world-writable, letting anyone swap the socket).
const SOCKET_DIR_MODE: u32 = 0o755;

/// Listens on `path` with permission bits `mode`. Creates the parent directory; replaces a
/// socket only when nothing answers on it (a broker that crashed); refuses anything else.
pub fn bind(path: &Path, mode: u32) -> Result<(UnixListener, SocketGuard), SocketError> {
    bind_with(path, mode, |_| {})
}

/// [`bind`], with `after_bind` run right after the socket file is created: tests use it to
/// swap the path under the broker at the worst moment.
fn bind_with(
    path: &Path,
    mode: u32,
    after_bind: impl FnOnce(&Path),
) -> Result<(UnixListener, SocketGuard), SocketError> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(SOCKET_DIR_MODE)
            .create(dir)
            .map_err(|source| SocketError::CreateDir {
                dir: dir.to_owned(),
                source,
            })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(SocketError::InUse {
                        path: path.to_owned(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    tracing::info!(socket = %path.display(), "replacing a stale socket nothing listens on");
                    std::fs::remove_file(path).map_err(|source| SocketError::RemoveStale {
                        path: path.to_owned(),
                        source,
                    })?;
                }
                Err(source) => {
                    return Err(SocketError::Inspect {
                        path: path.to_owned(),
                        source,
                    });
                }
            }
        }
        Ok(_) => {
            return Err(SocketError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SocketError::Inspect {
                path: path.to_owned(),
                source,
            });
        }
    }
    // The socket is created with 0777 & !umask: narrow the umask around bind so it never
    // exists, even briefly, with wider permissions than configured.
    // The umask is process-wide: one lock keeps two binds (the keeper's rebind, tests in one
    // process) from restoring each other's umask in between and creating a socket wider or
    // narrower than asked.
    let bound = {
        let _one_at_a_time = UMASK_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let old = umask(Mode::from_bits_truncate(!mode & 0o777));
        let bound = UnixListener::bind(path);
        umask(old);
        bound
    };
    let listener = bound.map_err(|source| SocketError::Bind {
        path: path.to_owned(),
        source,
    })?;
    after_bind(path);
    // No chmod: a chmod by path follows whatever is at the path by then (a symlink swapped
    // in by someone who can write the directory would get the mode). The umask above set it.
    let meta = std::fs::symlink_metadata(path).map_err(|source| SocketError::Inspect {
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_socket() {
        return Err(SocketError::Replaced {
            path: path.to_owned(),
        });
    }
    let guard = SocketGuard {
        path: path.to_owned(),
        inode: identity(&meta),
    };
    Ok((listener, guard))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn creates_the_directory_and_applies_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/broker.sock");
        let (_listener, guard) = bind(&path, 0o600).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        drop(guard);
        assert!(!path.exists(), "the guard removes the socket");
    }

    #[tokio::test]
    async fn refuses_a_file_that_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        std::fs::write(&path, "precious").unwrap();
        let err = bind(&path, 0o660).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    }

    #[tokio::test]
    async fn refuses_a_live_socket_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let (first, guard) = bind(&path, 0o660).unwrap();
        let err = bind(&path, 0o660).unwrap_err();
        assert!(matches!(err, SocketError::InUse { .. }), "{err}");
        // A crash leaves the file behind with nothing listening.
        drop(first);
        std::mem::forget(guard);
        assert!(path.exists());
        let (_again, _guard) = bind(&path, 0o660).unwrap();
    }

    #[tokio::test]
    async fn the_keeper_recreates_a_deleted_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let (listener, guard) = bind(&path, 0o600).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let keeper = SocketKeeper::start(path.clone(), 0o600, listener, guard, tx, |_| {});
        std::fs::remove_file(&path).unwrap();
        let mut back = false;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if path.exists() {
                back = true;
                break;
            }
        }
        assert!(back, "the socket was not recreated");
        assert_eq!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        let _client = UnixStream::connect(&path).await.unwrap();
        assert!(
            rx.recv().await.unwrap().is_ok(),
            "connections reach the server again"
        );
        keeper.stop().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!path.exists(), "stopping the keeper removes the socket");
    }

    /// Binds on several threads at once, each with its own mode: every socket gets exactly
    /// its mode (the umask switch is process-wide, so unserialized binds swap modes).
    #[test]
    fn concurrent_binds_each_get_their_own_mode() {
        let dir = tempfile::tempdir().unwrap();
        std::thread::scope(|scope| {
            for (t, mode) in [0o600, 0o660, 0o666, 0o640].into_iter().enumerate() {
                let dir = dir.path();
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let _entered = runtime.enter();
                    for i in 0..200 {
                        let path = dir.join(format!("{t}-{i}.sock"));
                        let (_listener, _guard) = bind(&path, mode).unwrap();
                        assert_eq!(mode_of(&path), mode, "{}", path.display());
                    }
                });
            }
        });
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    /// Any caller allowed to write the socket can touch or chmod it: neither makes it
    /// another socket.
    #[tokio::test]
    async fn touch_and_chmod_leave_the_socket_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let (_listener, guard) = bind(&path, 0o660).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(guard.in_place(), "chmod made the socket look replaced");
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &path,
            &nix::sys::time::TimeSpec::new(1, 0),
            &nix::sys::time::TimeSpec::new(1, 0),
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        assert!(guard.in_place(), "touch made the socket look replaced");
        drop(guard);
        assert!(!path.exists(), "the guard still removes its socket");
    }

    #[tokio::test(start_paused = true)]
    async fn the_keeper_does_not_rebind_after_a_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let (listener, guard) = bind(&path, 0o600).unwrap();
        let before = std::fs::symlink_metadata(&path).unwrap().ino();
        let (tx, _rx) = mpsc::channel(4);
        let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = lost.clone();
        let keeper = SocketKeeper::start(path.clone(), 0o600, listener, guard, tx, move |_| {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        tokio::time::sleep(SOCKET_CHECK_INTERVAL * 5).await;
        assert_eq!(mode_of(&path), 0o640, "the keeper bound a new socket");
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().ino(), before);
        assert!(!lost.load(std::sync::atomic::Ordering::SeqCst));
        keeper.stop().await;
        tokio::task::yield_now().await;
        for _ in 0..100 {
            if !path.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!path.exists(), "stopping the keeper removes the socket");
    }

    /// A symlink swapped in right after bind must not receive the socket's mode: the mode
    /// comes from the umask at bind, and nothing is ever chmod-ed by path.
    #[tokio::test]
    async fn a_symlink_swapped_in_after_bind_is_never_chmod_ed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let target = dir.path().join("precious");
        std::fs::write(&target, "secret").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let swap = |p: &Path| {
            std::fs::remove_file(p).unwrap();
            std::os::unix::fs::symlink(&target, p).unwrap();
        };
        let err = bind_with(&path, 0o666, swap).unwrap_err();
        assert!(matches!(err, SocketError::Replaced { .. }), "{err}");
        assert_eq!(mode_of(&target), 0o600, "the symlink's target was chmod-ed");
        assert!(
            std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink(),
            "the file someone else put there is left alone"
        );
    }

    #[tokio::test]
    async fn the_mode_comes_from_bind_alone() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o660, 0o666, 0o700] {
            let path = dir.path().join(format!("{mode:o}.sock"));
            let (_listener, _guard) = bind(&path, mode).unwrap();
            assert_eq!(mode_of(&path), mode);
        }
    }

    #[tokio::test]
    async fn the_guard_leaves_a_newer_socket_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.sock");
        let (first, old_guard) = bind(&path, 0o660).unwrap();
        drop(first);
        std::fs::remove_file(&path).unwrap();
        let (_second, _guard) = bind(&path, 0o660).unwrap();
        drop(old_guard);
        assert!(path.exists());
    }
}

/// Accepts connections for the server and keeps the socket file in place: if someone
/// deletes or replaces it (a cleanup job, an operator), the keeper binds it again, so
/// callers are not locked out of a broker that is still running.
#[derive(Debug)]
pub struct SocketKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl SocketKeeper {
    /// Starts accepting on `listener`; connections go to `tx`. `on_lost` is told when the
    /// file is gone and cannot be recreated (false), and when it is back (true).
    pub fn start(
        path: PathBuf,
        mode: u32,
        listener: UnixListener,
        guard: SocketGuard,
        tx: mpsc::Sender<std::io::Result<UnixStream>>,
        on_lost: impl Fn(bool) + Send + 'static,
    ) -> Self {
        let task = tokio::spawn(async move {
            let (mut listener, mut guard) = (listener, guard);
            let mut check = tokio::time::interval(SOCKET_CHECK_INTERVAL);
            let mut lost = false;
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            if tx.send(Ok(stream)).await.is_err() {
                                return; // the server is gone
                            }
                        }
                        Err(e) => {
                            tracing::warn!(socket = %path.display(), error = %e, "cannot accept a connection");
                            tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        }
                    },
                    _ = check.tick() => {
                        if guard.in_place() {
                            continue;
                        }
                        match bind(&path, mode) {
                            Ok((fresh, fresh_guard)) => {
                                tracing::warn!(socket = %path.display(), "the socket file was removed or replaced; recreated it");
                                (listener, guard) = (fresh, fresh_guard);
                                if lost {
                                    on_lost(true);
                                    lost = false;
                                }
                            }
                            Err(e) => {
                                if !lost {
                                    tracing::error!(socket = %path.display(), error = %e, "the socket file was removed or replaced and cannot be recreated; callers cannot reach the broker");
                                    on_lost(false);
                                    lost = true;
                                }
                            }
                        }
                    }
                }
            }
        });
        Self { task }
    }

    /// Stops accepting and removes the socket file (if it is still ours), by the time it
    /// returns: the process may exit right after, without the runtime running anything more.
    pub async fn stop(self) {
        // Aborting drops the task's guard, which removes the file; awaiting the aborted task
        // waits for that drop.
        self.task.abort();
        let _ = self.task.await;
    }
}
