//! Many threads picking at once: the pick and the reservation must be one step.
//!
//! With `load_only` (or `unified` on cache-cold prompts), P instances and
//! P × K picks held open, an atomic pick-and-reserve gives every instance
//! exactly K requests: each pick sees every earlier reservation. If choosing
//! and reserving were separate steps, two threads could both see the same
//! instance as least loaded and both land there, and the spread would exceed
//! zero. `split_steps_are_caught` runs the same harness on exactly such a
//! split router (choose from a view, then reserve) to show it catches that.

use std::sync::{Arc, Barrier};
use std::thread;

use engine_state_router::{Policy, Request, Reservation, Router, RouterSettings};

const INSTANCES: usize = 8;
const THREADS: usize = 16;
const PICKS_PER_THREAD: usize = 8;

fn router(policy: Policy) -> Router {
    let settings = RouterSettings {
        policy,
        ..RouterSettings::default()
    };
    let ids: Vec<String> = (0..INSTANCES).map(|i| format!("engine-{i}")).collect();
    Router::with_instances(settings, ids).unwrap()
}

/// Every thread picks `PICKS_PER_THREAD` times at once, holding what it got;
/// returns the spread (max − min) of `num_requests` while all are held.
fn spread_under_contention(
    router: &Router,
    pick: impl Fn(&Router, &Request) -> Reservation + Send + Sync + 'static,
) -> u64 {
    let barrier = Arc::new(Barrier::new(THREADS));
    let pick = Arc::new(pick);
    let held: Vec<Vec<Reservation>> = (0..THREADS)
        .map(|t| {
            let (router, barrier, pick) = (router.clone(), barrier.clone(), pick.clone());
            thread::spawn(move || {
                barrier.wait();
                (0..PICKS_PER_THREAD)
                    .map(|i| {
                        // Distinct cold prompts of equal length: no cache effects.
                        let tokens = vec![(t * 1000 + i) as u32; 600];
                        pick(&router, &Request::from_tokens(format!("{t}-{i}"), tokens))
                    })
                    .collect()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .collect();
    let loads: Vec<u64> = router
        .instances()
        .iter()
        .map(|v| v.shadow.num_requests)
        .collect();
    assert_eq!(
        loads.iter().sum::<u64>(),
        (THREADS * PICKS_PER_THREAD) as u64
    );
    drop(held);
    loads.iter().max().unwrap() - loads.iter().min().unwrap()
}

#[test]
fn concurrent_picks_never_double_book_an_instance() {
    for policy in [Policy::LoadOnly, Policy::Unified] {
        for _ in 0..20 {
            let router = router(policy);
            let spread = spread_under_contention(&router, |r, req| r.pick(req).unwrap().1);
            assert_eq!(
                spread, 0,
                "{policy}: a pick did not see a concurrent reservation"
            );
            // Every reservation was dropped: nothing leaked.
            assert!(router
                .instances()
                .iter()
                .all(|v| v.shadow.num_requests == 0));
            assert_eq!(router.stats().dropped, (THREADS * PICKS_PER_THREAD) as u64);
        }
    }
}

#[test]
fn concurrent_lifecycles_return_every_counter_to_zero() {
    let router = router(Policy::Unified);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let router = router.clone();
            thread::spawn(move || {
                for i in 0..200 {
                    let tokens = vec![(t % 3) as u32; 512 * (1 + i % 4) + 7];
                    let request = Request::from_tokens(format!("{t}-{i}"), tokens)
                        .with_session(format!("s{}", t % 5));
                    let (_, mut held) = router.pick(&request).unwrap();
                    match i % 3 {
                        0 => {
                            held.prefill_done();
                            held.complete();
                        }
                        1 => held.fail(),
                        _ => drop(held),
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    for view in router.instances() {
        assert_eq!(
            view.shadow,
            Default::default(),
            "{} leaked load",
            view.instance_id
        );
    }
}

/// The harness is sensitive: a router used as "choose from a view, then
/// reserve" (two lock holds) double-books under the same contention.
#[test]
fn split_steps_are_caught() {
    let split = |router: &Router, request: &Request| {
        let views = router.instances();
        let least = views.iter().min_by_key(|v| v.shadow.num_requests).unwrap();
        let instance = least.instance_id.clone();
        // The window a separate reserve step opens (an await, a lock release).
        thread::yield_now();
        router.reserve_on(request, &instance).unwrap().1
    };
    let caught = (0..50).any(|_| spread_under_contention(&router(Policy::LoadOnly), split) > 0);
    assert!(caught, "the harness never saw the split router double-book");
}
