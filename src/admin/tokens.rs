//! The admin listener's bearer tokens (`admin.token`, `admin.tokens`): read
//! once at start from their environment variables or files, and a request's
//! `Authorization: Bearer …` matched against them in constant time. Token
//! values are never logged; their names are.

use http::header::{HeaderMap, AUTHORIZATION};
use sha2::{Digest, Sha256};

use crate::config::{KeyFrom, KeySource};

/// Shortest token accepted: a guessable token is no lock.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why the tokens could not be read at start.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("admin token {name:?}: environment variable {var} is not set or not UTF-8")]
    Env { name: String, var: String },
    #[error("admin token {name:?}: cannot read {}: {source}", path.display())]
    File {
        name: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("admin token {name:?} is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort { name: String },
}

/// The tokens, by name, each kept as its SHA-256 (compared digest to
/// digest, so neither the length nor a prefix of a token shows in timing).
#[derive(Clone, Default)]
pub struct Tokens {
    tokens: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tokens.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

impl Tokens {
    /// Reads every token (surrounding whitespace trimmed).
    pub fn load(sources: &[KeySource]) -> Result<Tokens, TokenError> {
        let mut tokens = Vec::with_capacity(sources.len());
        for source in sources {
            let name = source.id.clone();
            let text = match &source.from {
                KeyFrom::Env(var) => std::env::var(var).map_err(|_| TokenError::Env {
                    name: name.clone(),
                    var: var.clone(),
                })?,
                KeyFrom::File(path) => {
                    std::fs::read_to_string(path).map_err(|source| TokenError::File {
                        name: name.clone(),
                        path: path.clone(),
                        source,
                    })?
                }
            };
            let text = text.trim();
            if text.len() < MIN_TOKEN_LEN {
                return Err(TokenError::TooShort { name });
            }
            tokens.push((name, digest(text.as_bytes())));
        }
        Ok(Tokens { tokens })
    }

    /// Tokens from `(name, value)` pairs, for tests.
    pub fn from_values<'a>(values: impl IntoIterator<Item = (&'a str, &'a str)>) -> Tokens {
        Tokens {
            tokens: values
                .into_iter()
                .map(|(name, value)| (name.to_owned(), digest(value.as_bytes())))
                .collect(),
        }
    }

    /// Whether any token is configured.
    pub fn any(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name of the token the request's `Authorization: Bearer` header
    /// carries; `None` without one, or for a token not configured. Every
    /// configured token is compared, whichever matches.
    pub fn who(&self, headers: &HeaderMap) -> Option<&str> {
        let mut values = headers.get_all(AUTHORIZATION).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let value = value.to_str().ok()?;
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let offered = digest(token.trim().as_bytes());
        let mut found = None;
        for (name, known) in &self.tokens {
            if same(&offered, known) && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Constant time: every byte is looked at whatever the first difference.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn the_bearer_token_names_who_it_is() {
        let t = Tokens::from_values([
            ("ops", "0123456789abcdef-ops"),
            ("lead", "0123456789abcdef-lead"),
        ]);
        assert_eq!(t.who(&with("Bearer 0123456789abcdef-lead")), Some("lead"));
        assert_eq!(t.who(&with("bearer 0123456789abcdef-ops")), Some("ops"));
        assert_eq!(t.who(&with("Bearer 0123456789abcdef-op")), None);
        assert_eq!(t.who(&with("Basic 0123456789abcdef-ops")), None);
        assert_eq!(t.who(&HeaderMap::new()), None);
        assert_eq!(Tokens::default().who(&with("Bearer x")), None);
    }
}
