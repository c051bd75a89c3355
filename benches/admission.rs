//! Cost of signing and verifying an admission pass, which happens on every
//! gated request: a two-key ring (one signing, one being rotated out), a
//! route name of typical length and a current expiry.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use queuegate::admission::{new_visitor_id, KeyRing, Kind, Verdict};

const ROUTE: &str = "tickets";
const EXPIRY: u64 = 1_767_225_660;

fn ring() -> KeyRing {
    let keys = vec![
        ("k2".to_owned(), vec![2u8; 32]),
        ("k1".to_owned(), vec![1u8; 32]),
    ];
    match KeyRing::new(keys) {
        Ok(ring) => ring,
        Err(err) => panic!("bench key ring: {err}"),
    }
}

fn pass_sign(c: &mut Criterion) {
    let ring = ring();
    let id = new_visitor_id();
    c.bench_function("pass_sign", |b| {
        b.iter(|| {
            ring.sign(
                Kind::Pass,
                black_box(ROUTE),
                black_box(&id),
                black_box(EXPIRY),
            )
        })
    });
}

fn pass_verify(c: &mut Criterion) {
    let ring = ring();
    let value = ring.sign(Kind::Pass, ROUTE, &new_visitor_id(), EXPIRY);
    assert!(
        matches!(ring.verify(&value, ROUTE), Verdict::Valid(_)),
        "the benchmarked pass must be valid"
    );
    c.bench_function("pass_verify", |b| {
        b.iter(|| ring.verify(black_box(&value), black_box(ROUTE)))
    });
}

criterion_group!(benches, pass_sign, pass_verify);
criterion_main!(benches);
