//! Who is calling, as the transport knows it: the [`Peer`] of a call, from the credentials
//! its connection put in the request's extensions (`conn`'s [`PeerCred`], read once when the
//! connection was accepted; tonic's `UdsConnectInfo` for a plain `UnixStream`). Used by the
//! services, the rate limit and the decoder's refusals; the core only sees the plain [`Peer`].

use tonic::transport::server::UdsConnectInfo;

use crate::broker::Peer;
use crate::conn::PeerCred;

/// The peer credentials (SO_PEERCRED) of the call's connection: both unknown when the
/// transport is not a Unix socket.
pub fn peer(extensions: &http::Extensions) -> Peer {
    let cred = extensions.get::<PeerCred>().copied().or_else(|| {
        extensions
            .get::<UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .map(|c| PeerCred {
                uid: c.uid(),
                gid: c.gid(),
            })
    });
    Peer {
        uid: cred.map(|c| c.uid),
        gid: cred.map(|c| c.gid),
    }
}
