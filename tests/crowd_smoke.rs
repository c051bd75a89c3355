//! A small crowd against one queuegate binary on the memory store: 300
//! visitors arriving at 100/s for a route of capacity 20. Everyone who stayed
//! is admitted, never more than the capacity at once, in join order, and the
//! origin sees exactly the requests of admitted visitors.

#[path = "../benches/crowd/fleet.rs"]
mod fleet;
#[path = "../benches/crowd/sim.rs"]
mod sim;

use std::time::Duration;

use fleet::{GateSpec, Origin, Queuegate};
use sim::Plan;

const VISITORS: usize = 300;
const CAPACITY: u64 = 20;
const BROWSES: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_300_keeps_capacity_and_join_order() {
    let origin = Origin::start().await;
    let mut spec = GateSpec::quick("crowd", "/event", CAPACITY);
    // Polls come every ~300 ms (abandon_after / 3), so slots turn over fast.
    spec.abandon_after = Duration::from_millis(900);
    let gate = Queuegate::start(&spec, &origin.url(), &fleet::run_key());
    let plan = Plan {
        targets: vec![gate.url()],
        route: spec.route.clone(),
        path: spec.path.clone(),
        capacity: CAPACITY,
        session_ttl: spec.session_ttl,
        visitors: VISITORS,
        rate: 100.0,
        leave: 0.90,
        vanish: 0.05,
        ghost: 0.05,
        browses: BROWSES,
        think: Duration::from_millis(30),
        deadline: Duration::from_secs(60),
        seed: 7,
        patient: false,
    };
    let report = sim::run(plan).await;
    let table = report.table();
    println!("{table}");

    assert_eq!(report.errors, 0, "{table}\n{}", gate.log_tail(20));
    assert_eq!(report.unfinished, 0, "{table}");
    assert_eq!(report.never_admitted, 0, "{table}");
    assert_eq!(
        report.admitted + report.ghosts,
        VISITORS as u64,
        "everyone but the ghosts got in: {table}"
    );
    assert!(report.max_admitted <= CAPACITY, "{table}");
    assert_eq!(report.inversions, 0, "{table}");
    // The gate's own count of inversions agrees, and its wait histogram
    // counted each admission from the line once.
    let metrics = gate.metrics();
    let sample = |series: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
    };
    assert_eq!(
        sample(r#"queuegate_admission_inversions_total{route="crowd"}"#),
        0.0
    );
    assert_eq!(
        sample(r#"queuegate_wait_seconds_count{route="crowd",lane="main"}"#),
        sample(r#"queuegate_admitted_total{route="crowd",how="from_line"}"#),
    );
    assert!(report.joins >= 100, "a line formed: {table}");
    assert!(report.no_shows > 0 && report.ghosts > 0, "{table}");
    assert_eq!(
        origin.hits(),
        report.at_once + report.admitted * u64::from(BROWSES),
        "the origin saw exactly the admitted visitors' requests: {table}"
    );
}
