//! Waiting until something holds, instead of for a fixed time. Each wait
//! fails loudly at its deadline: a guard against a hang, never a timing a
//! test asserts.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::visitor::{status, PublicUrl, Visitor};

/// Calls `attempt` every `every` until it gives `Ok`, and returns its
/// value; past `within`, fails naming `what` and the last error.
async fn retry<T, E, F, Fut>(what: &str, within: Duration, every: Duration, mut attempt: F) -> T
where
    E: fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {within:?} waiting until {what}: {e}")
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// How long `eventually` waits, and how often it checks.
const WITHIN: Duration = Duration::from_secs(10);
const EVERY: Duration = Duration::from_millis(10);
const NOT_YET: &str = "it never held";

/// Waits for `cond` to hold, checking every 10 ms, failing after 10 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let check = || std::future::ready(cond().then_some(()).ok_or(NOT_YET));
    retry(what, WITHIN, EVERY, check).await
}

/// As [`eventually`], for a condition that has to be awaited.
pub async fn eventually_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let check = || {
        let held = cond();
        async move { held.await.then_some(()).ok_or(NOT_YET) }
    };
    retry(what, WITHIN, EVERY, check).await
}

/// Retries `op` until it succeeds (a store reconnecting, say), every 50 ms,
/// failing after 30 s with its last error; its value.
pub async fn until_ok<T, E, F, Fut>(what: &str, op: F) -> T
where
    E: fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    retry(what, Duration::from_secs(30), Duration::from_millis(50), op).await
}

/// Polls `v`'s status of the route `tickets` on `at` every 20 ms until it
/// is admitted; fails after 10 s.
pub async fn wait_admitted(v: &mut Visitor, at: &impl PublicUrl) {
    for _ in 0..500 {
        if status(v, at).await["state"] == "admitted" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never admitted");
}
