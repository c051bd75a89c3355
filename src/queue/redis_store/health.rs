//! A route's health windows and adaptive capacity in Redis (DESIGN §9.1):
//! `lua/adapt.lua` keeps them, `lua/coord.lua` (the split line's
//! coordinator lease) says who decides each window.

use std::time::Duration;

use super::{ms, unexpected_reply, RedisStore};
use crate::health::{WindowCounts, BUCKETS};
use crate::queue::{HealthLook, StoreError};

fn health_key(route: &str) -> String {
    format!("qg:{{{route}}}:health")
}

fn lease_key(route: &str) -> String {
    format!("qg:{{{route}}}:adapt")
}

impl RedisStore {
    pub(super) async fn report_health_on(
        &self,
        route: &str,
        counts: &WindowCounts,
        every: Duration,
    ) -> Result<HealthLook, StoreError> {
        let mut invocation = self.scripts.adapt.prepare_invoke();
        invocation
            .key(health_key(route))
            .key(lease_key(route))
            .arg("report")
            .arg(ms(every).max(1))
            .arg(counts.requests)
            .arg(counts.errors);
        for (bucket, n) in counts.nonzero_buckets() {
            invocation.arg(bucket).arg(n);
        }
        let (capacity, why, window, requests, errors, pairs): (
            i64,
            String,
            u64,
            u64,
            u64,
            Vec<u64>,
        ) = self.run(&invocation).await?;
        let mut ended = WindowCounts {
            requests,
            errors,
            ..WindowCounts::default()
        };
        for pair in pairs.chunks(2) {
            match pair {
                [bucket, n] if (*bucket as usize) < BUCKETS => ended.buckets[*bucket as usize] = *n,
                _ => return Err(unexpected_reply(format!("health bucket {pair:?}"))),
            }
        }
        Ok(HealthLook {
            capacity: u64::try_from(capacity).ok().filter(|&c| c > 0),
            why,
            window,
            ended,
        })
    }

    pub(super) async fn take_health_lease_on(
        &self,
        route: &str,
        every: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let mut invocation = self.scripts.coord.prepare_invoke();
        invocation
            .key(lease_key(route))
            .key(health_key(route))
            .arg("take")
            .arg(ms(every).max(1))
            .arg(ms(every).max(1));
        let generation: u64 = self.run(&invocation).await?;
        Ok((generation != 0).then_some(generation))
    }

    pub(super) async fn set_capacity_on(
        &self,
        route: &str,
        lease: u64,
        capacity: u64,
        why: &str,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.scripts.adapt.prepare_invoke();
        invocation
            .key(health_key(route))
            .key(lease_key(route))
            .arg("set")
            .arg(lease)
            .arg(capacity)
            .arg(why);
        let set: i64 = self.run(&invocation).await?;
        Ok(set == 1)
    }
}
