//! Feeding the router from an engine-state reader: the one place the reader's
//! status becomes the router's `fresh` flag.

use engine_state_reader::{EngineState, Reading, ReplicaReading, ReplicaState, Status};

use crate::effective::RealState;
use crate::peers::PeerReservations;
use crate::router::Router;

impl From<&ReplicaState> for PeerReservations {
    /// Only [`Status::Fresh`] is fresh, as for an engine.
    fn from(state: &ReplicaState) -> PeerReservations {
        PeerReservations {
            replica_id: state.replica_id.clone(),
            fresh: state.status == Status::Fresh,
            heartbeat_age: state.heartbeat_age,
            read_mono_ns: state.read_mono_ns,
            engines: state.engines.clone(),
        }
    }
}

impl From<&EngineState> for RealState {
    /// Only [`Status::Fresh`] is fresh; stale, dead and torn state is stored
    /// but never merged.
    fn from(state: &EngineState) -> RealState {
        RealState {
            snapshot: state.snapshot,
            fresh: state.status == Status::Fresh,
            capture_age: state.capture_age,
            heartbeat_age: state.heartbeat_age,
            read_mono_ns: state.read_mono_ns,
            cache: state.cache.clone(),
        }
    }
}

impl Router {
    /// Stores the real state of every engine in `reading` (engine id =
    /// instance id); engines the router does not route to are ignored.
    /// Returns how many were stored. Call it after each reader poll.
    pub fn update_from_reading(&self, reading: &Reading) -> usize {
        self.update_real_state(
            reading
                .engines
                .iter()
                .map(|e| (&*e.engine_id, RealState::from(e))),
        )
    }

    /// Replaces the peers' reservations with every replica in `reading`
    /// (docs/ROUTING.md, "Shared reservations"; the reader leaves this
    /// router's own record out). Returns how many (replica, engine) entries
    /// were stored. Call it after each poll of the replicas.
    pub fn update_from_replicas(&self, reading: &ReplicaReading) -> usize {
        let peers: Vec<PeerReservations> = reading
            .replicas
            .iter()
            .map(PeerReservations::from)
            .collect();
        self.update_peer_reservations(&peers)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use engine_state_reader::{EngineState, Reading, Snapshot, Status};

    use crate::{Policy, Request, Router, RouterSettings};

    fn engine(id: &str, status: Status, running: u64) -> EngineState {
        EngineState {
            engine_id: id.into(),
            status,
            snapshot: Snapshot {
                num_running: running,
                ..Snapshot::default()
            },
            heartbeat_age: Duration::from_millis(5),
            capture_age: Duration::from_millis(10),
            generation: 1,
            read_mono_ns: engine_state_shm_format::monotonic_ns(),
            writer: Default::default(),
            clock_ahead: false,
            cache: None,
        }
    }

    #[test]
    fn fresh_readings_steer_and_others_do_not() {
        let settings = RouterSettings {
            policy: Policy::LoadOnly,
            ..RouterSettings::default()
        };
        let router = Router::with_instances(settings, ["a", "b"]).unwrap();
        let reading = Reading {
            engines: vec![
                engine("a", Status::Fresh, 9),
                engine("b", Status::Dead, 50),
                engine("zz", Status::Fresh, 1),
            ],
            errors: vec![],
        };
        assert_eq!(
            router.update_from_reading(&reading),
            2,
            "unknown engine ignored"
        );
        // a is busy by fresh real state; b's dead state is not merged, so b looks idle.
        let (decision, _r) = router
            .pick(&Request::from_tokens("r", vec![1; 600]))
            .unwrap();
        assert_eq!(decision.instance_id, "b");
        assert!(decision.consulted_real_state);
        assert_eq!(router.instance("a").unwrap().effective.num_requests, 9);
        assert_eq!(
            router.instance("b").unwrap().effective.num_requests,
            1,
            "shadow only: the pick just made"
        );
    }
}
