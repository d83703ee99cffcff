//! Who is calling, as the transport knows it: the [`Peer`] of a call, from the
//! `UdsConnectInfo` its connection put in the request's extensions (`conn` puts it there
//! for guarded connections, tonic for a plain `UnixStream`). Used by the services, the rate
//! limit and the decoder's refusals; the core only sees the plain [`Peer`].

use tonic::transport::server::UdsConnectInfo;

use crate::broker::Peer;

/// The peer credentials (SO_PEERCRED) of the call's connection: both unknown when the
/// transport is not a Unix socket.
pub fn peer(extensions: &http::Extensions) -> Peer {
    let cred = extensions
        .get::<UdsConnectInfo>()
        .and_then(|info| info.peer_cred);
    Peer {
        uid: cred.map(|c| c.uid()),
        gid: cred.map(|c| c.gid()),
    }
}
