//! Replicated pairs for the live-data tests, started from the binaries on the machine:
//! a MariaDB GTID replica of a MariaDB primary, and a PostgreSQL logical-replication
//! subscriber of a publisher. Each is a real replication link with the lag a real one
//! has (MariaDB's can be made longer with `MASTER_DELAY`); writers are server-side
//! loops run by a client process ([`Server::spawn_sql`]).

use std::time::{Duration, Instant};

use crate::db::{self, Server};

/// A MariaDB primary (binary log in ROW format, server id 1) and its replica (server
/// id 2, no binary log) replicating by GTID.
#[derive(Debug)]
pub struct MariaDbPair {
    pub primary: Server,
    pub replica: Server,
}

fn mariadb_one(s: &Server, sql: &str) -> String {
    s.exec(None, sql).trim().to_string()
}

impl MariaDbPair {
    /// Both servers, the replica applying every event `delay_secs` after the primary
    /// wrote it (`MASTER_DELAY`; 0 for none).
    pub fn start(delay_secs: u32) -> MariaDbPair {
        let primary =
            db::start_mariadb_configured(&["--server-id=1", "--log-bin=binlog", "--binlog-format=ROW"]);
        let replica = db::start_mariadb_configured(&["--server-id=2"]);
        replica.exec(
            None,
            &format!(
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', \
                 MASTER_USE_GTID=slave_pos, MASTER_DELAY={delay_secs}; START SLAVE;",
                primary.port
            ),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let running = mariadb_one(&replica, "SHOW GLOBAL STATUS LIKE 'Slave_running'");
            if running.ends_with("ON") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica does not replicate: {running}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        MariaDbPair { primary, replica }
    }

    /// Waits until the replica has applied everything the primary has written so far.
    pub fn wait_caught_up(&self) {
        let pos = mariadb_one(&self.primary, "SELECT @@gtid_binlog_pos");
        let timeout = 120;
        let r = mariadb_one(
            &self.replica,
            &format!("SELECT MASTER_GTID_WAIT('{pos}', {timeout})"),
        );
        assert_eq!(r, "0", "the replica did not apply {pos} within {timeout} s");
    }

    /// Changes the replica's delay (replication restarts from where it was).
    pub fn set_delay(&self, delay_secs: u32) {
        self.replica.exec(
            None,
            &format!("STOP SLAVE; CHANGE MASTER TO MASTER_DELAY={delay_secs}; START SLAVE;"),
        );
    }
}

/// A PostgreSQL publisher (`wal_level = logical`) and a subscriber.
#[derive(Debug)]
pub struct PgLogicalPair {
    pub publisher: Server,
    pub subscriber: Server,
}

impl PgLogicalPair {
    pub fn start() -> PgLogicalPair {
        PgLogicalPair {
            publisher: db::start_postgres_configured(&["wal_level=logical", "max_wal_senders=10"]),
            subscriber: db::start_postgres_configured(&[]),
        }
    }

    /// Creates database `db` on both servers with `schema` (the same DDL on both), and
    /// replicates `tables` from the publisher to the subscriber (publication `db_pub`,
    /// subscription `db_sub`); returns once the initial copy is done.
    pub fn replicate(&self, db: &str, schema: &str, tables: &[&str]) -> String {
        self.publisher.create_database(db);
        self.subscriber.create_database(db);
        self.publisher.exec(Some(db), schema);
        self.subscriber.exec(Some(db), schema);
        self.publisher.exec(
            Some(db),
            &format!("CREATE PUBLICATION {db}_pub FOR TABLE {};", tables.join(", ")),
        );
        let sub = format!("{db}_sub");
        self.subscriber.exec(
            Some(db),
            &format!(
                "CREATE SUBSCRIPTION {sub} CONNECTION 'host=127.0.0.1 port={} user=postgres dbname={db}' \
                 PUBLICATION {db}_pub;",
                self.publisher.port
            ),
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let pending = self.subscriber.exec(
                Some(db),
                "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r';",
            );
            if pending.trim() == "0" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the initial copy of {db} did not finish"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_caught_up(db);
        sub
    }

    /// Waits until the subscriber of `db` has applied the publisher's WAL written so
    /// far (the replication slot's confirmed position, as the publisher sees it).
    pub fn wait_caught_up(&self, db: &str) {
        let lsn = self
            .publisher
            .exec(Some(db), "SELECT pg_current_wal_insert_lsn();");
        let lsn = lsn.trim();
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let behind = self.publisher.exec(
                Some(db),
                &format!(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{db}_sub' \
                     AND (confirmed_flush_lsn IS NULL OR confirmed_flush_lsn < '{lsn}');"
                ),
            );
            if behind.trim() == "0" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the subscriber of {db} did not apply {lsn}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops or restarts the subscription's apply (the publisher keeps its changes).
    pub fn set_enabled(&self, db: &str, enabled: bool) {
        self.subscriber.exec(
            Some(db),
            &format!(
                "ALTER SUBSCRIPTION {db}_sub {};",
                if enabled { "ENABLE" } else { "DISABLE" }
            ),
        );
    }
}
