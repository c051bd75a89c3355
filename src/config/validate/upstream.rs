//! `upstream`: the origin queuegate forwards to, and the pool of
//! connections to it.

use super::field::{duration, file_path, positive, required, to_usize};
use crate::config::defaults;
use crate::config::error::FieldPath;
use crate::config::problems::Problems;
use crate::config::raw::RawUpstream;
use crate::config::{Pool, Upstream};

pub(super) fn upstream(
    raw: Option<RawUpstream>,
    at: &FieldPath,
    problems: &mut Problems,
) -> Option<Upstream> {
    let Some(raw) = raw else {
        problems.report(
            at.clone(),
            "the upstream section is required, e.g. `upstream: { url: http://127.0.0.1:3000 }`",
        );
        return None;
    };
    let url = required(raw.url, &at.key("url"), problems)
        .and_then(|url| upstream_url(&url, &at.key("url"), problems));
    let connect_timeout = positive(
        raw.connect_timeout,
        defaults::CONNECT_TIMEOUT,
        &at.key("connect_timeout"),
        problems,
    );
    let timeout = positive(
        raw.timeout,
        defaults::UPSTREAM_TIMEOUT,
        &at.key("timeout"),
        problems,
    );
    let pool = raw.pool.unwrap_or_default();
    let pool = Pool {
        max_idle_per_host: to_usize(
            pool.max_idle_per_host
                .unwrap_or(defaults::POOL_MAX_IDLE_PER_HOST),
        ),
        idle_timeout: duration(pool.idle_timeout, defaults::POOL_IDLE_TIMEOUT),
    };
    let host = match raw.host {
        None => Some(None),
        Some(host) => match host.parse::<http::uri::Authority>() {
            Ok(authority) if !authority.as_str().contains('@') && !authority.host().is_empty() => {
                Some(Some(host))
            }
            _ => {
                problems.report(
                    at.key("host"),
                    format!("invalid host {host:?}: expected a host name, optionally with :port"),
                );
                None
            }
        },
    };
    if let (Some(url), Some(_)) = (&url, &raw.ca_file) {
        if url.scheme_str() != Some("https") {
            problems.report(at.key("ca_file"), "only used with an https:// upstream url");
        }
    }
    let ca_file = match raw.ca_file {
        None => Some(None),
        Some(path) => file_path(path, &at.key("ca_file"), problems).map(Some),
    };
    Some(Upstream {
        url: url?,
        connect_timeout,
        timeout,
        pool,
        host: host?,
        origin_reads_forwarded_host: raw
            .origin_reads_forwarded_host
            .unwrap_or(defaults::ORIGIN_READS_FORWARDED_HOST),
        ca_file: ca_file?,
    })
}

fn upstream_url(text: &str, at: &FieldPath, problems: &mut Problems) -> Option<http::Uri> {
    let mut fail = |why: &str| {
        problems.report(at.clone(), format!("invalid upstream url {text:?}: {why}"));
        None
    };
    let uri: http::Uri = match text.parse() {
        Ok(uri) => uri,
        Err(err) => return fail(&err.to_string()),
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(_) => return fail("the scheme must be http or https"),
        None => return fail("expected http://host:port or https://host:port"),
    }
    match uri.authority() {
        Some(authority) if authority.as_str().contains('@') => {
            return fail("credentials in the url are not supported")
        }
        Some(authority) if !authority.host().is_empty() => {}
        _ => return fail("the url needs a host"),
    }
    if !matches!(uri.path(), "" | "/") {
        return fail("a path is not supported: requests are forwarded with their own path");
    }
    if uri.query().is_some() {
        return fail("a query is not supported");
    }
    Some(uri)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn upstream_url_is_an_origin_only() {
        for (url, why) in [
            ("ftp://x.com", "scheme"),
            ("127.0.0.1:3000", "http://host:port"),
            ("http://x.com/app", "path"),
            ("http://x.com/?a=1", "query"),
            ("http://user:pw@x.com", "credentials"),
            ("http:///", "invalid upstream url"),
        ] {
            let text = format!(
                "listen: [{{ addr: 127.0.0.1:8080 }}]\nupstream: {{ url: '{url}' }}\nkeys: [{{ id: k1, env: K }}]\n"
            );
            let errors = Config::from_yaml(&text).expect_err(url);
            let message = &errors.at("upstream.url").expect(url).message;
            assert!(message.contains(why), "{url}: {message}");
        }
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: 'https://[::1]:8443/' }\nkeys: [{ id: k1, env: K }]\n";
        let config = Config::from_yaml(text).unwrap();
        assert_eq!(config.upstream.url.scheme_str(), Some("https"));
    }

    #[test]
    fn upstream_url_is_required_and_ca_file_needs_https() {
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { timeout: 5s }\nkeys: [{ id: k1, env: K }]\n";
        let errors = Config::from_yaml(text).unwrap_err();
        assert_eq!(errors.errors.len(), 1);
        assert_eq!(errors.errors[0].path, "upstream.url");
        assert_eq!(errors.errors[0].line, Some(2), "{errors}");
        let text = "listen: [{ addr: 127.0.0.1:8080 }]\nupstream: { url: http://a:1, ca_file: /ca.pem }\nkeys: [{ id: k1, env: K }]\n";
        assert!(Config::from_yaml(text)
            .unwrap_err()
            .at("upstream.ca_file")
            .is_some());
    }
}
