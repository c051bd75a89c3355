//! `listen` and `admin`: the addresses queuegate listens on, and whether the
//! admin listener is open without a token.

use std::net::SocketAddr;

use super::field::{required, required_path};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawListen;
use crate::config::{Admin, KeySource, Listen, TlsFiles};

pub(super) fn listen(
    raw: Option<Vec<RawListen>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<Listen>> {
    let Some(raw) = raw.filter(|raw| !raw.is_empty()) else {
        problems.report(
            at.clone(),
            "at least one listener is required, e.g. `- addr: 0.0.0.0:8080`",
        );
        return None;
    };
    let mut listeners: Vec<Option<Listen>> = Vec::new();
    for (i, item) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let addr = required(item.addr.map(|a| a.0), &at.key("addr"), problems);
        let tls = match item.tls {
            None => Some(None),
            Some(tls) => {
                let cert = required_path(tls.cert, &at.key("tls").key("cert"), problems);
                let key = required_path(tls.key, &at.key("tls").key("key"), problems);
                cert.zip(key)
                    .map(|(cert, key)| Some(TlsFiles { cert, key }))
            }
        };
        if let Some(addr) = addr.filter(|a| a.port() != 0) {
            if let Some(j) = listeners
                .iter()
                .position(|other| other.as_ref().is_some_and(|other| other.addr == addr))
            {
                problems.report(at.key("addr"), format!("{addr} is also listen[{j}].addr"));
            }
        }
        listeners.push(addr.zip(tls).map(|(addr, tls)| Listen { addr, tls }));
    }
    listeners.into_iter().collect()
}

/// `admin.addr`, default [`defaults::ADMIN_ADDR`].
pub(super) fn admin(addr: Option<SocketAddr>, tokens: Vec<KeySource>) -> Option<Admin> {
    Some(Admin {
        addr: addr.unwrap_or(defaults::ADMIN_ADDR),
        tokens,
    })
}

/// An admin listener off loopback without a token: anyone who reaches it
/// reads the metrics and the live view (the controls stay refused).
pub(super) fn admin_off_loopback_needs_a_token(
    admin: &Admin,
    at: &FieldPath,
    problems: &mut Problems,
) {
    if !admin.addr.ip().is_loopback() && admin.tokens.is_empty() {
        problems.warn(
            at.key("addr"),
            format!(
                "the admin listener is on {} without admin.token: anyone who reaches it \
                 sees the live view; keep it on loopback or set a token",
                admin.addr
            ),
        );
    }
}

/// The admin listener shares no address with a public one (port 0, a free
/// port the system picks, never clashes).
pub(super) fn admin_is_not_a_listener(
    listen: &[Listen],
    admin: &Admin,
    at: &FieldPath,
    problems: &mut Problems,
) {
    if let Some(i) = listen
        .iter()
        .position(|l| l.addr == admin.addr && admin.addr.port() != 0)
    {
        problems.report(
            at.clone(),
            format!("{} is also listen[{i}].addr", admin.addr),
        );
    }
}
