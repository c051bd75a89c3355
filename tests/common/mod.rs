//! The integration-test harness, one module a concern: origins on
//! ephemeral ports (`origin`); queuegate run in-process on real sockets
//! (`gate`); visitors and hand-written clients (`visitor`); the binary as a
//! child process (`process`); several instances sharing one Redis (`fleet`);
//! waiting until something holds (`poll`); real `redis-server`s (`redis`);
//! fixtures for calling a store directly (`store`, imported by name); and
//! a real Tomcat serving its example webapp (`tomcat`, imported by name).
//! A test file says `mod common;` and `use common::*;`.
//!
//! `redis` is private, its items exported here: a module of that name in
//! the glob would shadow the `redis` crate in the test files.
#![allow(dead_code)]

mod fleet;
mod gate;
mod origin;
mod poll;
mod process;
mod redis;
pub mod store;
pub mod tomcat;
mod visitor;

// Each test file uses part of this: what it leaves is no warning.
#[allow(unused_imports)]
pub use self::{
    fleet::*,
    gate::*,
    origin::*,
    poll::*,
    process::*,
    redis::{free_port, RedisCluster, RedisSentinel, RedisServer, SENTINEL_MASTER},
    visitor::*,
};
