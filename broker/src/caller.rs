//! Who is calling, as the transport knows it: the [`Peer`] of a call, from the credentials
//! its connection put in the request's extensions (`conn`'s [`PeerCred`], read once when the
//! connection was accepted). Used by the accept loop, the services, the rate limit and the
//! decoder's refusals; the core only sees the plain [`Peer`].

use crate::broker::Peer;
use crate::conn::PeerCred;

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
