//! `keys` and `cookie`: where the keys that sign passes come from (and the
//! admin tokens, read the same way), and the
//! cookies' domain.

use std::collections::HashMap;

use super::field::{file_path, required};
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawKey;
use crate::config::{is_key_id, CookieConfig, KeyFrom, KeySource, MAX_KEY_ID_LEN};

pub(super) fn keys(
    raw: Option<Vec<RawKey>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<KeySource>> {
    let Some(raw) = raw.filter(|raw| !raw.is_empty()) else {
        problems.report(
            at.clone(),
            "at least one key is required, e.g. `- { id: k1, env: QUEUEGATE_KEY_K1 }`",
        );
        return None;
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut keys = Vec::new();
    for (i, key) in raw.into_iter().enumerate() {
        let at = at.index(i);
        let id = required(key.id, &at.key("id"), problems).filter(|id| {
            if is_key_id(id) {
                true
            } else {
                problems.report(
                    at.key("id"),
                    format!("invalid key id {id:?}: use 1 to {MAX_KEY_ID_LEN} of A-Z a-z 0-9 _ -"),
                );
                false
            }
        });
        if let Some(id) = &id {
            if let Some(j) = seen.insert(id.clone(), i) {
                problems.report(at.key("id"), format!("key id {id:?} is also keys[{j}].id"));
            }
        }
        let from = secret_from(key.env, key.file, &at, "keys", problems);
        keys.push(id.zip(from).map(|(id, from)| KeySource { id, from }));
    }
    keys.into_iter().collect()
}

/// Where a secret (a key, an admin token) is read from: exactly one of an
/// environment variable and a file, never the YAML itself.
fn secret_from(
    env: Option<String>,
    file: Option<std::path::PathBuf>,
    at: &FieldPath,
    what: &str,
    problems: &mut Problems,
) -> Option<KeyFrom> {
    match (env, file) {
        (Some(env), None) => {
            if env.is_empty() || env.contains(['=', '\0']) {
                problems.report(
                    at.key("env"),
                    format!("invalid environment variable name {env:?}"),
                );
                None
            } else {
                Some(KeyFrom::Env(env))
            }
        }
        (None, Some(file)) => file_path(file, &at.key("file"), problems).map(KeyFrom::File),
        (Some(_), Some(_)) => {
            problems.report(at.clone(), "give exactly one of env, file (found both)");
            None
        }
        (None, None) => {
            problems.report(
                at.clone(),
                format!("give exactly one of env, file: {what} never live in this file"),
            );
            None
        }
    }
}

/// `admin.token` (one token, named `admin`, no `id`) and `admin.tokens`
/// (named like keys): the bearer tokens of the admin controls, names
/// unique across both. `None` when one is invalid.
pub(super) fn admin_tokens(
    token: Option<RawKey>,
    tokens: Option<Vec<RawKey>>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Vec<KeySource>> {
    let mut out = Vec::new();
    let mut valid = true;
    if let Some(token) = token {
        let at = at.key("token");
        if token.id.is_some() {
            problems.report(
                at.key("id"),
                "admin.token is named admin; list named tokens under admin.tokens",
            );
        }
        match secret_from(token.env, token.file, &at, "tokens", problems) {
            Some(from) => out.push(KeySource {
                id: "admin".to_owned(),
                from,
            }),
            None => valid = false,
        }
    }
    let at = at.key("tokens");
    for (i, token) in tokens.unwrap_or_default().into_iter().enumerate() {
        let at = at.index(i);
        let id = required(token.id, &at.key("id"), problems).filter(|id| {
            let ok = is_key_id(id);
            if !ok {
                problems.report(
                    at.key("id"),
                    format!(
                        "invalid token name {id:?}: use 1 to {MAX_KEY_ID_LEN} of A-Z a-z 0-9 _ -"
                    ),
                );
            } else if out.iter().any(|t: &KeySource| t.id == *id) {
                problems.report(at.key("id"), format!("token name {id:?} is used twice"));
            }
            ok
        });
        let from = secret_from(token.env, token.file, &at, "tokens", problems);
        match id.zip(from) {
            Some((id, from)) => out.push(KeySource { id, from }),
            None => valid = false,
        }
    }
    valid.then_some(out)
}

pub(super) fn cookie(
    domain: Option<String>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<CookieConfig> {
    let Some(domain) = domain else {
        return Some(CookieConfig::default());
    };
    let bare = domain.strip_prefix('.').unwrap_or(&domain);
    let valid = !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if !valid {
        problems.report(
            at.clone(),
            format!("invalid cookie domain {domain:?}: expected a domain such as example.com"),
        );
        return None;
    }
    Some(CookieConfig {
        domain: Some(bare.to_ascii_lowercase()),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, problem_paths};
    use crate::config::{Config, CookieConfig};

    #[test]
    fn keys_need_exactly_one_source_and_unique_ids() {
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: http://a:1 }\nkeys:\n  - { id: k1 }\n  - { id: k2, env: A, file: /b }\n  - { id: k2, file: /c }\n  - { env: D }\n";
        let errors = Config::from_yaml(text).unwrap_err();
        let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["keys[0]", "keys[1]", "keys[2].id", "keys[3].id"]);
    }

    #[test]
    fn cookie_domain_is_checked_and_lower_cased() {
        let config = parse("cookie: { domain: .Example.com }\n").unwrap();
        assert_eq!(config.cookie.domain.as_deref(), Some("example.com"));
        assert_eq!(
            problem_paths("cookie: { domain: 'a;b' }\n"),
            ["cookie.domain"]
        );
        assert_eq!(
            parse("cookie: {}\n").unwrap().cookie,
            CookieConfig::default()
        );
    }
}
