//! The connection to the broker, bounded by one deadline from `connect` to the last byte.
//!
//! The bound used to be kept by a second thread that made the call while the first waited
//! on a channel with a timeout. Starting that thread and waking the first one cost about
//! 0.15 ms of a cache hit's 1.4 ms (BENCHMARKS.md section 1), so the socket keeps the
//! bound itself: Linux's Unix-socket `connect` waits for room in a full backlog only as long
//! as the socket's send timeout (`SO_SNDTIMEO`, set before connecting), and each read and
//! write is given what is left of the deadline, so a broker that drips a byte at a time
//! cannot stretch the call past it either.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};
use nix::sys::time::{TimeVal, TimeValLike as _};

/// Why the connection could not be made.
#[derive(Debug)]
pub enum ConnectError {
    /// The deadline passed while the broker's backlog was full.
    TimedOut,
    /// Anything else: no such socket, refused, permission denied, a path too long.
    Io(io::Error),
}

/// A connected socket whose reads and writes end at `deadline`, with an
/// [`io::ErrorKind::TimedOut`] error once it has passed.
#[derive(Debug)]
pub struct Bounded {
    stream: UnixStream,
    deadline: Instant,
}

/// Connects to the Unix socket at `path` before `deadline`.
pub fn connect(path: &Path, deadline: Instant) -> Result<Bounded, ConnectError> {
    let io = |e: Errno| ConnectError::Io(e.into());
    let addr = UnixAddr::new(path).map_err(io)?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io)?;
    let left = left(deadline).ok_or(ConnectError::TimedOut)?;
    socket::setsockopt(&fd, sockopt::SendTimeout, &timeval(left)).map_err(io)?;
    match socket::connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        // A full backlog for as long as the send timeout: the kernel gives up with EAGAIN.
        Err(Errno::EAGAIN) => return Err(ConnectError::TimedOut),
        Err(e) => return Err(io(e)),
    }
    Ok(Bounded {
        stream: UnixStream::from(fd),
        deadline,
    })
}

impl Bounded {
    /// What is left of the deadline, or the error that says it passed.
    fn left(&self) -> io::Result<Duration> {
        left(self.deadline).ok_or_else(|| io::ErrorKind::TimedOut.into())
    }
}

/// A socket timeout that ran out reads as `WouldBlock` (EAGAIN); it is the deadline's.
fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::ErrorKind::TimedOut.into()
    } else {
        e
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf).map_err(timed_out)
    }
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf).map_err(timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// The time until `deadline`, `None` once it has passed. Never zero: a zero socket timeout
/// means no timeout at all.
fn left(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
}

/// `d` as the `timeval` of a socket timeout, at least one microsecond (zero would mean
/// none) and at most what the field holds.
fn timeval(d: Duration) -> TimeVal {
    let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX).max(1);
    TimeVal::microseconds(micros)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::Backlog;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_full_backlog_times_out_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        // Never accepts: connections pile up in its backlog of one until it is full.
        let listener = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        socket::listen(&listener, Backlog::new(1).unwrap()).unwrap();
        let mut held = Vec::new();
        let started = Instant::now();
        let outcome = loop {
            assert!(held.len() < 100, "the backlog never filled");
            match connect(&path, Instant::now() + Duration::from_millis(100)) {
                Ok(conn) => held.push(conn),
                Err(e) => break e,
            }
        };
        assert!(matches!(outcome, ConnectError::TimedOut), "{outcome:?}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn a_drip_of_bytes_cannot_stretch_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drip.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let dripper = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            // A byte every 20 ms: each read gets one before a per-read timeout of 300 ms.
            for _ in 0..100 {
                if peer.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let started = Instant::now();
        let mut conn = connect(&path, started + Duration::from_millis(300)).unwrap();
        let mut byte = [0u8; 1];
        let error = loop {
            match conn.read(&mut byte) {
                Ok(1) => {}
                Ok(_) => panic!("the dripper closed first"),
                Err(e) => break e,
            }
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(waited < Duration::from_millis(1500), "{waited:?}");
        drop(conn);
        dripper.join().unwrap();
    }

    #[test]
    fn no_socket_is_an_io_error_that_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let e = connect(
            &dir.path().join("none.sock"),
            Instant::now() + Duration::from_secs(1),
        )
        .unwrap_err();
        match e {
            ConnectError::Io(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn timeouts_are_never_zero() {
        assert_eq!(timeval(Duration::ZERO), TimeVal::microseconds(1));
        assert_eq!(timeval(Duration::from_nanos(10)), TimeVal::microseconds(1));
        assert_eq!(
            timeval(Duration::from_secs(30)),
            TimeVal::microseconds(30_000_000)
        );
        assert_eq!(left(Instant::now() - Duration::from_secs(1)), None);
    }
}
