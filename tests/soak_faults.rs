//! The soak bench's Redis faults against a real `redis-server`: a paused
//! Redis answers nothing until it is continued and then still has its data;
//! a killed one comes back empty on the same port.

#[path = "../benches/crowd/fleet.rs"]
mod fleet;
#[path = "../benches/proxy/http.rs"]
#[allow(dead_code)]
mod http;
#[path = "../benches/proxy/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "../benches/soak/stack.rs"]
#[allow(dead_code)]
mod stack;

use std::time::Duration;

fn connect(url: &str) -> redis::Connection {
    let con = redis::Client::open(url)
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(1)))
        .unwrap_or_else(|err| panic!("connecting to {url}: {err}"));
    con.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap_or_else(|err| panic!("{err}"));
    con
}

fn get(con: &mut redis::Connection) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg("soak").query(con)
}

#[test]
fn a_paused_redis_hangs_until_continued_and_a_killed_one_comes_back_empty() {
    let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
    let mut redis = stack::Redis::start(dir.path()).unwrap_or_else(|err| panic!("{err:#}"));
    let url = redis.url();
    let mut con = connect(&url);
    let () = redis::cmd("SET")
        .arg("soak")
        .arg("kept")
        .query(&mut con)
        .unwrap_or_else(|err| panic!("{err}"));

    // Asked while paused, a GET gets no answer within its read timeout.
    let asked = {
        let mut con = connect(&url);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            get(&mut con)
        })
    };
    redis
        .pause(Duration::from_secs(1))
        .unwrap_or_else(|err| panic!("{err:#}"));
    let during = asked
        .join()
        .unwrap_or_else(|_| panic!("the asking thread panicked"));
    assert!(during.is_err(), "a paused Redis answered: {during:?}");
    assert_eq!(
        get(&mut connect(&url)).ok().flatten().as_deref(),
        Some("kept"),
        "continued, Redis keeps its data"
    );

    redis
        .kill_and_restart(Duration::from_millis(100))
        .unwrap_or_else(|err| panic!("{err:#}"));
    assert_eq!(redis.url(), url, "started again on the same port");
    assert_eq!(
        get(&mut connect(&url)).unwrap_or_else(|err| panic!("{err}")),
        None,
        "a killed Redis comes back empty"
    );
}
