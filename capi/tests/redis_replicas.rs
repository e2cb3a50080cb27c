//! `es_open_replicas` / `es_read_replicas` over Redis, real processes: a
//! redis-server started on a free port and an `esreplica` router replica
//! publishing its reservations there (`<prefix>routers`,
//! `<prefix>router:<id>`); the C ABI reads them as on shared memory: the
//! replica's requests, fresh, back to zero after completion, and never the
//! reader's own.
//!
//! Every `unsafe` call passes a live handle, C strings, or locals of the
//! sizes given with them: the SAFETY argument is made once here.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::ptr::{null, null_mut};

use engine_state::{
    es_close_replicas, es_open_replicas, es_read_replicas, EsCode, EsReplica, EsReplicas,
    EsReservation, EsStatus, ES_MAX_ROUTER_ENGINES,
};
use engine_state_tests::{bin, wait_for, Proc, RedisServer};

fn open(uri: &str, own: &str) -> *mut EsReplicas {
    let (uri, own) = (CString::new(uri).unwrap(), CString::new(own).unwrap());
    let mut out = null_mut();
    let code = unsafe { es_open_replicas(uri.as_ptr(), own.as_ptr(), null(), &mut out) };
    assert_eq!(code, EsCode::Ok);
    out
}

/// Every replica read: (id, status, total requests).
fn read(source: *mut EsReplicas) -> Vec<(String, EsStatus, u64)> {
    let mut replicas = [EsReplica::default(); 4];
    let mut entries = [EsReservation::default(); 4 * ES_MAX_ROUTER_ENGINES];
    let (mut count, mut entry_count) = (0, 0);
    let code = unsafe {
        es_read_replicas(
            source,
            replicas.as_mut_ptr(),
            replicas.len(),
            &mut count,
            entries.as_mut_ptr(),
            entries.len(),
            &mut entry_count,
        )
    };
    assert_eq!(code, EsCode::Ok);
    replicas[..count]
        .iter()
        .map(|r| {
            let mine =
                &entries[r.first_engine as usize..(r.first_engine + r.engine_count) as usize];
            let requests = mine.iter().map(|e| e.counters.num_requests).sum();
            (r.replica_id().to_owned(), r.status, requests)
        })
        .collect()
}

#[test]
fn es_read_replicas_reads_a_replica_esreplica_publishes_to_redis() {
    let server = RedisServer::start();
    let uri = server.uri("?prefix=capi-replicas:");
    let mut replica = Proc::spawn(
        Command::new(bin("esreplica"))
            .args(["--uri", &uri, "--replica-id", "r1", "--engines", "e0,e1"])
            .stdout(Stdio::piped()),
    );
    let mut stdin = replica.0.stdin.take().unwrap();
    let mut stdout = BufReader::new(replica.0.stdout.take().unwrap());
    let mut say = |command: &str| {
        if !command.is_empty() {
            writeln!(stdin, "{command}").unwrap();
        }
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line
    };
    assert!(say("").contains("ready"));
    assert!(say("pick 2 100").contains("\"held\":2"));
    let peers = open(&uri, "r0");
    let own = open(&uri, "r1");
    wait_for(
        || read(peers) == [("r1".to_owned(), EsStatus::Fresh, 2)],
        "r1's 2 requests over Redis",
    );
    assert_eq!(read(own), []);
    assert!(say("complete").contains("\"held\":0"));
    wait_for(
        || read(peers) == [("r1".to_owned(), EsStatus::Fresh, 0)],
        "r1 back to zero",
    );
    unsafe {
        es_close_replicas(peers);
        es_close_replicas(own);
    }
}
