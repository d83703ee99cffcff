//! Who is calling, owned here once: the socket's [`Peer`] (the uid and gid the kernel reports,
//! read once when the connection was accepted: `conn`'s [`PeerCred`]) and the client-go
//! process the shim says it runs for ([`CallerId`]), together a [`Caller`]. The transport
//! turns a connection's credentials into a [`Peer`] here ([`peer`], [`of`]); the core and the
//! cache only see the plain types.

use credbroker_proto::v1;

use crate::base::conn::PeerCred;

/// Who is calling: the uid and gid the kernel reports for the socket's peer
/// (SO_PEERCRED). Both unknown when the transport cannot tell; the transport modules fill
/// it in (`caller::peer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Who asks for a token: the socket's peer and, when the shim sent it, the client-go
/// process it runs for. A caller that sends no [`CallerId`] (an older shim, grpcurl) is
/// served as one that never re-asks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    pub peer: Peer,
    pub id: Option<CallerId>,
}

impl Caller {
    /// The caller of a `GetToken` from `peer`, with the message's `caller` checked.
    pub fn from_proto(peer: Peer, id: Option<&v1::Caller>) -> Result<Self, CallerError> {
        Ok(Self {
            peer,
            id: id.map(CallerId::from_proto).transpose()?,
        })
    }

    /// The socket peer's uid: whose share of the upstream permits a miss takes.
    pub fn uid(&self) -> Option<u32> {
        self.peer.uid
    }
}

/// One client-go process asking for one exec config: its pid, the process's start time (a
/// reused pid is another process) and a digest of the exec config and cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerId {
    pub pid: u32,
    pub start_time: u64,
    config: [u8; 32],
}

impl CallerId {
    /// Checks the wire message's fixed forms (the request limits: no field can grow).
    pub fn from_proto(c: &v1::Caller) -> Result<Self, CallerError> {
        if c.pid == 0 || c.pid > PID_MAX_LIMIT {
            return Err(CallerError::Pid(c.pid));
        }
        let digest = c.config_digest.as_bytes();
        let bad = || CallerError::Digest(digest.len());
        if digest.len() != 64 {
            return Err(bad());
        }
        let mut config = [0u8; 32];
        for (out, pair) in config.iter_mut().zip(digest.chunks_exact(2)) {
            let nibble = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'a'..=b'f' => Some(b - b'a' + 10),
                _ => None,
            };
            *out = (nibble(pair[0]).ok_or_else(bad)? << 4) | nibble(pair[1]).ok_or_else(bad)?;
        }
        Ok(Self {
            pid: c.pid,
            start_time: c.start_time,
            config,
        })
    }

    #[cfg(test)]
    pub fn new(pid: u32, start_time: u64, config: u8) -> Self {
        Self {
            pid,
            start_time,
            config: [config; 32],
        }
    }
}

/// Linux's PID_MAX_LIMIT (2^22): no process id is larger.
pub const PID_MAX_LIMIT: u32 = 1 << 22;

/// Why a request's `caller` was refused. Never quotes the caller's text: the fields have a
/// fixed form, so their size says enough.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerError {
    #[error("caller.pid is {0}: a process id is between 1 and {PID_MAX_LIMIT} (PID_MAX_LIMIT)")]
    Pid(u32),
    #[error(
        "caller.configDigest must be a SHA-256 as 64 lowercase hex digits; got {0} bytes of something else"
    )]
    Digest(usize),
}

impl CallerError {
    /// The request field at fault, for the status's ErrorInfo.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Pid(_) => "caller.pid",
            Self::Digest(_) => "caller.configDigest",
        }
    }
}

/// The peer credentials (SO_PEERCRED) of the call's connection: both unknown when the
/// socket could not tell.
pub fn peer(extensions: &http::Extensions) -> Peer {
    of(extensions.get::<PeerCred>().copied())
}

/// The [`Peer`] with these credentials, both unknown for `None`.
pub fn of(cred: Option<PeerCred>) -> Peer {
    Peer {
        uid: cred.map(|c| c.uid),
        gid: cred.map(|c| c.gid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_fields_have_fixed_forms() {
        let ok = v1::Caller {
            pid: 4242,
            start_time: 99,
            config_digest: "0123456789abcdef".repeat(4),
        };
        let id = CallerId::from_proto(&ok).unwrap();
        assert_eq!((id.pid, id.start_time), (4242, 99));
        assert_eq!(
            id.config[..8],
            [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]
        );
        for (pid, digest, want) in [
            (0, ok.config_digest.clone(), CallerError::Pid(0)),
            (
                PID_MAX_LIMIT + 1,
                ok.config_digest.clone(),
                CallerError::Pid(PID_MAX_LIMIT + 1),
            ),
            (1, "ab".into(), CallerError::Digest(2)),
            (1, "0123456789ABCDEF".repeat(4), CallerError::Digest(64)),
            (1, "g".repeat(64), CallerError::Digest(64)),
            (1, "é".repeat(32), CallerError::Digest(64)),
            (1, "0".repeat(10_000), CallerError::Digest(10_000)),
        ] {
            let c = v1::Caller {
                pid,
                start_time: 1,
                config_digest: digest,
            };
            assert_eq!(CallerId::from_proto(&c), Err(want.clone()));
            assert!(want.to_string().starts_with("caller."), "{want}");
        }
    }
}
