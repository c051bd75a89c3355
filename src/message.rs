//! An answer as queuegate makes or relays it ([`Answer`]): its status,
//! version and fields as a [`Fields`] list (no `HeaderMap`), a reason
//! phrase the origin gave, whether it refuses a request the client got
//! wrong, and its body. HTTP/1 answers are written from it by `h1::answer`;
//! hyper (HTTP/2, the admin listener) gets it as an `http::Response`
//! ([`Answer::into_http`]).

use bytes::Bytes;
use http::{HeaderMap, StatusCode, Version};

use crate::fields::Fields;

/// An answer's head: everything but its body.
#[derive(Debug, Clone)]
pub struct AnswerHead {
    pub status: StatusCode,
    /// The version the origin answered in (HTTP/1.1 for queuegate's own).
    pub version: Version,
    pub fields: Fields,
    /// The origin's reason phrase, when not its status code's own.
    pub reason: Option<hyper::ext::ReasonPhrase>,
    /// Answers a request the client got wrong (`response::from_error`
    /// marks it): the request counts as a bad request, even one refused
    /// only after the gate had let it through (a body found unreadable
    /// while it was relayed).
    pub client_error: bool,
}

/// An answer (see the module docs).
#[derive(Debug)]
pub struct Answer<B> {
    head: AnswerHead,
    body: B,
}

impl<B> Answer<B> {
    /// `200` in HTTP/1.1 with no fields, and `body`.
    pub fn new(body: B) -> Answer<B> {
        Answer::from_parts(
            AnswerHead {
                status: StatusCode::OK,
                version: Version::HTTP_11,
                fields: Fields::new(),
                reason: None,
                client_error: false,
            },
            body,
        )
    }

    pub fn from_parts(head: AnswerHead, body: B) -> Answer<B> {
        Answer { head, body }
    }

    pub fn into_parts(self) -> (AnswerHead, B) {
        (self.head, self.body)
    }

    pub fn status(&self) -> StatusCode {
        self.head.status
    }

    pub fn status_mut(&mut self) -> &mut StatusCode {
        &mut self.head.status
    }

    pub fn headers(&self) -> &Fields {
        &self.head.fields
    }

    pub fn headers_mut(&mut self) -> &mut Fields {
        &mut self.head.fields
    }

    pub fn is_client_error(&self) -> bool {
        self.head.client_error
    }

    /// Marks it as the answer to a request the client got wrong.
    pub fn mark_client_error(&mut self) {
        self.head.client_error = true;
    }

    pub fn body_mut(&mut self) -> &mut B {
        &mut self.body
    }

    /// The same answer with its body made by `f`.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> Answer<C> {
        Answer {
            head: self.head,
            body: f(self.body),
        }
    }

    /// The answer as hyper takes it: its fields moved into a `HeaderMap`
    /// (for HTTP/2 and the admin listener, not for HTTP/1's engine).
    pub fn into_http(self) -> http::Response<B> {
        let mut headers = HeaderMap::with_capacity(self.head.fields.len());
        for (name, value) in self.head.fields.into_named() {
            headers.append(name, value);
        }
        let mut resp = http::Response::new(self.body);
        *resp.status_mut() = self.head.status;
        *resp.version_mut() = self.head.version;
        *resp.headers_mut() = headers;
        if let Some(reason) = self.head.reason {
            resp.extensions_mut().insert(reason);
        }
        resp
    }
}

/// A reason phrase, if `bytes` may be one (as hyper takes it).
pub fn reason(bytes: Bytes) -> Option<hyper::ext::ReasonPhrase> {
    hyper::ext::ReasonPhrase::try_from(bytes).ok()
}
