//! The harness itself: both servers start and answer.

use tally_e2e::db;

#[test]
fn postgres_and_mariadb_start_and_answer() {
    let pg = db::postgres();
    pg.create_database("harness");
    assert_eq!(pg.exec(Some("harness"), "SELECT 40 + 2;").trim(), "42");
    let my = db::mariadb();
    my.create_database("harness");
    assert_eq!(my.exec(Some("harness"), "SELECT 40 + 2;").trim(), "42");
    assert!(
        my.exec(None, "SELECT VERSION();")
            .to_lowercase()
            .contains("mariadb")
    );
}
