//! The SQLite Raft store against openraft's own storage test suite, and across a restart.

use std::collections::BTreeMap;

use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite, blank_ent, log_id};
use openraft::{
    AnyError, Entry, EntryPayload, Membership, RaftSnapshotBuilder, StorageError, StorageIOError, Vote,
};
use serde_json::json;
use tally_coordinator::raft::{
    self, Command, NodeId, Replica, Response, Schedule, SqliteLogStore, SqliteStateMachine, TypeConfig,
};
use tempfile::TempDir;

/// Each case of the suite gets a fresh database in its own temp dir (the guard).
struct FreshStore;

impl StoreBuilder<TypeConfig, SqliteLogStore, SqliteStateMachine, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, SqliteLogStore, SqliteStateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (log, sm) = raft::open(dir.path())
            .await
            .map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        Ok((dir, log, sm))
    }
}

// The suite builds its own tokio runtime per case, so this is a plain test.
#[test]
fn openraft_storage_suite() {
    Suite::test_all(FreshStore).expect("openraft storage suite");
}

fn normal(term: u64, index: u64, command: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Normal(command),
    }
}

fn event(run_id: &str, seq: u64, level: u64) -> Command {
    Command::AppendRunEvent {
        run_id: run_id.to_string(),
        seq,
        event: json!({ "level_committed": level }),
    }
}

fn nightly() -> Schedule {
    Schedule {
        cron: "0 3 * * *".to_string(),
        spec: json!({ "name": "orders" }),
        created: 1_700_000_000,
        by: "ops".to_string(),
    }
}

#[tokio::test]
async fn log_vote_and_state_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let members = BTreeMap::from([(
        1,
        Replica {
            addr: "10.0.0.1:7400".into(),
        },
    )]);
    let membership = Entry::<TypeConfig> {
        log_id: log_id(1, 1, 1),
        payload: EntryPayload::Membership(Membership::new(vec![[1].into()], members)),
    };
    let entries = vec![
        blank_ent::<TypeConfig>(1, 1, 0),
        membership,
        normal(1, 2, event("r1", 0, 1)),
        normal(1, 3, event("r1", 1, 2)),
        normal(
            1,
            4,
            Command::PutSchedule {
                name: "nightly".into(),
                schedule: nightly(),
            },
        ),
        // A stale append (seq 1 again) is refused, deterministically.
        normal(1, 5, event("r1", 1, 9)),
    ];
    let vote = Vote::new_committed(1, 1);
    {
        let (mut log, mut sm) = raft::open(dir.path()).await.unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        log.save_vote(&vote).await.unwrap();
        log.save_committed(Some(log_id(1, 1, 4))).await.unwrap();
        let responses = sm.apply(entries[..5].to_vec()).await.unwrap();
        assert_eq!(
            responses,
            vec![
                Response::None,
                Response::None,
                Response::EventAppended { seq: 0 },
                Response::EventAppended { seq: 1 },
                Response::SchedulePut,
            ]
        );
        let responses = sm.apply(entries[5..].to_vec()).await.unwrap();
        assert_eq!(responses, vec![Response::SeqConflict { expected: 2 }]);
        log.purge(log_id(1, 1, 0)).await.unwrap();
    }

    let (mut log, mut sm) = raft::open(dir.path()).await.unwrap();
    assert_eq!(log.read_vote().await.unwrap(), Some(vote));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 1, 4)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 0)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 5)));
    let got = log.try_get_log_entries(1..).await.unwrap();
    assert_eq!(got, entries[1..].to_vec());

    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 1, 5)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1, 1)));
    assert_eq!(
        membership.membership().get_node(&1).unwrap().addr,
        "10.0.0.1:7400"
    );
    let reader = sm.reader();
    assert_eq!(
        reader.run_events("r1").await.unwrap(),
        vec![json!({ "level_committed": 1 }), json!({ "level_committed": 2 }),]
    );
    assert_eq!(
        reader.schedules().await.unwrap(),
        BTreeMap::from([("nightly".to_string(), nightly())])
    );
}

#[tokio::test]
async fn a_snapshot_carries_the_state_to_another_replica_and_survives_its_restart() {
    let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, mut leader) = raft::open(leader_dir.path()).await.unwrap();
    leader
        .apply(vec![
            normal(2, 1, event("r1", 0, 1)),
            normal(2, 2, event("r2", 0, 1)),
            normal(
                2,
                3,
                Command::PutSchedule {
                    name: "nightly".into(),
                    schedule: nightly(),
                },
            ),
            normal(
                2,
                4,
                Command::PutSchedule {
                    name: "hourly".into(),
                    schedule: nightly(),
                },
            ),
            normal(
                2,
                5,
                Command::DeleteSchedule {
                    name: "hourly".into(),
                },
            ),
        ])
        .await
        .unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 1, 5)));

    {
        let (_, mut follower) = raft::open(follower_dir.path()).await.unwrap();
        // The follower had state of its own: the snapshot replaces it.
        follower
            .apply(vec![normal(1, 1, event("stale", 0, 7))])
            .await
            .unwrap();
        let mut data = follower.begin_receiving_snapshot().await.unwrap();
        *data = *snapshot.snapshot;
        follower.install_snapshot(&snapshot.meta, data).await.unwrap();
    }

    let (_, mut follower) = raft::open(follower_dir.path()).await.unwrap();
    let current = follower
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(current.meta, snapshot.meta);
    assert_eq!(follower.applied_state().await.unwrap().0, Some(log_id(2, 1, 5)));
    let reader = follower.reader();
    assert!(reader.run_events("stale").await.unwrap().is_empty());
    assert_eq!(
        reader.run_events("r2").await.unwrap(),
        vec![json!({ "level_committed": 1 })]
    );
    assert_eq!(
        reader.schedules().await.unwrap(),
        BTreeMap::from([("nightly".to_string(), nightly())])
    );
}

#[tokio::test]
async fn a_snapshot_that_does_not_parse_leaves_the_state_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut sm) = raft::open(dir.path()).await.unwrap();
    sm.apply(vec![normal(1, 1, event("r1", 0, 1))]).await.unwrap();
    let mut meta = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
        .meta;
    meta.last_log_id = Some(log_id(3, 1, 9));
    let data = Box::new(std::io::Cursor::new(b"not json".to_vec()));
    assert!(sm.install_snapshot(&meta, data).await.is_err());
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 1, 1)));
    assert_eq!(sm.reader().run_events("r1").await.unwrap().len(), 1);
    let current = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("the built snapshot");
    assert_eq!(current.meta.last_log_id, Some(log_id(1, 1, 1)));
}
