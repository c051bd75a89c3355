//! A client's request as the request road sees it, whichever protocol
//! brought it ([`ClientRequest`]): its method, target and version, its
//! header fields as a list ([`Fields`], no `HeaderMap`), its body
//! ([`ClientBody`]) and, for an HTTP/1 request that asks for `Upgrade`,
//! its way to the connection once answered `101`.

use http::{Method, Uri, Version};

use crate::client_body::{ClientBody, OnUpgrade};
use crate::fields::Fields;

/// A client's request (see the module docs).
#[derive(Debug)]
pub struct ClientRequest {
    method: Method,
    uri: Uri,
    version: Version,
    fields: Fields,
    body: ClientBody,
    upgrade: Option<OnUpgrade>,
}

impl ClientRequest {
    /// A request of `method` for `uri` in `version`, with `fields` and
    /// `body`.
    pub fn new(
        method: Method,
        uri: Uri,
        version: Version,
        fields: Fields,
        body: ClientBody,
    ) -> ClientRequest {
        ClientRequest {
            method,
            uri,
            version,
            fields,
            body,
            upgrade: None,
        }
    }

    /// An HTTP/2 request, its fields moved out of hyper's map.
    pub fn h2(req: http::Request<hyper::body::Incoming>) -> ClientRequest {
        let (parts, body) = req.into_parts();
        ClientRequest::new(
            parts.method,
            parts.uri,
            parts.version,
            Fields::from(parts.headers),
            ClientBody::h2(body),
        )
    }

    /// With the way to its connection once answered `101`.
    pub fn with_upgrade(mut self, on: OnUpgrade) -> ClientRequest {
        self.upgrade = Some(on);
        self
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    pub fn uri_mut(&mut self) -> &mut Uri {
        &mut self.uri
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn headers(&self) -> &Fields {
        &self.fields
    }

    pub fn headers_mut(&mut self) -> &mut Fields {
        &mut self.fields
    }

    pub fn body(&self) -> &ClientBody {
        &self.body
    }

    /// The way to its connection once answered `101`, taken (there is
    /// one only for an HTTP/1 request that asked for `Upgrade`).
    pub fn take_upgrade(&mut self) -> Option<OnUpgrade> {
        self.upgrade.take()
    }

    /// Its parts: method, target, version, fields and body.
    pub fn into_parts(self) -> (Method, Uri, Version, Fields, ClientBody) {
        (self.method, self.uri, self.version, self.fields, self.body)
    }
}
