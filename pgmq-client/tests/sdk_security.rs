//! The pgmq_sdk schema against hostile roles and a changing database, each
//! on a database of its own: a schema squatted before the install, another
//! role's object inside it, tenants that may touch only their own queues,
//! the least rights of each feature, and the state that must follow a
//! queue's table (spellings of a name, a queue dropped and created again,
//! a purge, PGMQ re-installed). The roles are made by the test and dropped
//! at the end; role `pgmq` of the throwaway cluster has CREATEROLE for it.

mod common;

use std::time::Duration;

use pgmq_client::{Client, DedupKey, Error, FleetLimit, KeyFrom, KeyLimit, QueueName, ReadOptions};
use serde_json::json;

use common::OwnDb;

/// A login role of the test's own, dropped (with what it owns and its
/// grants in `db`) when the guard goes.
struct Role {
    name: String,
    db: String,
}

impl Role {
    async fn new(db: &OwnDb, prefix: &str, attrs: &str) -> Role {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!("r_{prefix}_{}_{nanos:x}", std::process::id());
        let admin = common::raw_to(&db.dsn()).await;
        admin
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN PASSWORD 'pw-{name}' {attrs}; \
                 GRANT CONNECT ON DATABASE \"{}\" TO \"{name}\"",
                db_name(&db.dsn())
            ))
            .await
            .unwrap();
        Role { name, db: db.dsn() }
    }

    fn dsn(&self) -> String {
        let mut info = pgmq_client::ConnInfo::parse(&self.db).unwrap();
        info.set("user", &self.name).unwrap();
        info.set("password", &format!("pw-{}", self.name)).unwrap();
        info.to_dsn()
    }

    async fn raw(&self) -> tokio_postgres::Client {
        common::raw_to(&self.dsn()).await
    }

    async fn client(&self) -> Client {
        pgmq_client::ClientBuilder::new(&self.dsn())
            .max_size(2)
            .connect()
            .await
            .unwrap()
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let (name, dsn) = (self.name.clone(), self.db.clone());
        common::run_detached(move || async move {
            let admin = common::raw_to(&dsn).await;
            let _ = admin
                .batch_execute(&format!(
                    "GRANT \"{name}\" TO CURRENT_USER; \
                     SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity \
                     WHERE usename = '{name}'; \
                     DROP OWNED BY \"{name}\" CASCADE; DROP ROLE IF EXISTS \"{name}\""
                ))
                .await;
        });
    }
}

fn db_name(dsn: &str) -> String {
    let info = pgmq_client::ConnInfo::parse(dsn).unwrap();
    info.get("dbname").unwrap().to_owned()
}

fn is_untrusted(e: &Error) -> bool {
    matches!(e, Error::SdkSchemaUntrusted { .. })
}

fn is_denied(e: &Error) -> bool {
    e.sqlstate() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
}

/// A squatter's schema `pgmq_sdk` whose `schema_version` is a view that
/// records who ran it, and a `send_batch_keyed` that records who ran it and
/// answers "duplicate": the install and the client must refuse it before
/// running either.
#[tokio::test]
async fn a_schema_another_role_made_first_is_refused_and_never_run() {
    let db = OwnDb::new("sdk_squat").await;
    let squatter = Role::new(&db, "squat", "").await;
    let admin = common::raw_to(&db.dsn()).await;
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON DATABASE \"{}\" TO \"{}\"",
            db_name(&db.dsn()),
            squatter.name
        ))
        .await
        .unwrap();
    squatter
        .raw()
        .await
        .batch_execute(
            "CREATE SCHEMA pgmq_sdk;
             GRANT USAGE ON SCHEMA pgmq_sdk TO PUBLIC;
             CREATE TABLE pgmq_sdk.ran (who text);
             GRANT INSERT, SELECT ON pgmq_sdk.ran TO PUBLIC;
             CREATE FUNCTION pgmq_sdk.evil() RETURNS integer LANGUAGE sql AS
               $$ INSERT INTO pgmq_sdk.ran VALUES (current_user) RETURNING 2 $$;
             CREATE VIEW pgmq_sdk.schema_version AS SELECT pgmq_sdk.evil() AS version;
             GRANT SELECT ON pgmq_sdk.schema_version TO PUBLIC;
             CREATE FUNCTION pgmq_sdk.send_batch_keyed(text, text[], jsonb[], jsonb[], timestamptz, interval)
               RETURNS TABLE (msg_id bigint, duplicate boolean) LANGUAGE sql AS
               $$ INSERT INTO pgmq_sdk.ran VALUES (current_user) RETURNING 1::bigint, true $$;",
        )
        .await
        .unwrap();

    let client = db.client().await;
    let e = client.install_sdk_schema().await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");
    assert!(e.to_string().contains(&squatter.name), "{e}");
    let e = client.sdk_schema_version().await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");

    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    let key = DedupKey::new("order-42", Duration::from_secs(60));
    let e = client.send_keyed(&q, &key, &json!(42)).await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");
    assert_eq!(e.outcome(), pgmq_client::CommitOutcome::NotSent);
    let e = client.pause(&q, None).await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");

    let ran: i64 = admin
        .query_one("SELECT count(*) FROM pgmq_sdk.ran", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ran, 0, "the squatter's code ran");
    drop(squatter);
}

/// An installed schema into which another role put a function (its owner
/// granted CREATE): the install refuses to go on, and clients stop
/// running the schema.
#[tokio::test]
async fn another_roles_object_in_the_schema_is_refused() {
    let db = OwnDb::new("sdk_foreign").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let other = Role::new(&db, "planter", "").await;
    let admin = common::raw_to(&db.dsn()).await;
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON SCHEMA pgmq_sdk TO \"{}\"",
            other.name
        ))
        .await
        .unwrap();
    other
        .raw()
        .await
        .batch_execute(
            "CREATE FUNCTION pgmq_sdk.queue_paused(text, integer) RETURNS boolean \
             LANGUAGE sql AS $$ SELECT false $$",
        )
        .await
        .unwrap();
    let e = client.install_sdk_schema().await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("queue_paused") && text.contains(&other.name),
        "{text}"
    );

    // A client connecting now checks before its first call of the schema.
    let fresh = db.client().await;
    let q = QueueName::new("orders").unwrap();
    fresh.create(&q).await.unwrap();
    let e = fresh.is_paused(&q).await.unwrap_err();
    assert!(is_untrusted(&e), "{e:?}");
    drop(other);
}

/// Grants a tenant what PGMQ needs to send to, read and acknowledge
/// messages of queue `q` (and nothing of any other queue).
async fn grant_queue(admin: &tokio_postgres::Client, q: &QueueName, role: &str) {
    let (t, a) = (q.table_name(), q.archive_table_name());
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA pgmq TO \"{role}\";
             GRANT SELECT ON pgmq.meta TO \"{role}\";
             GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq.{t}, pgmq.{a} TO \"{role}\";
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO \"{role}\";"
        ))
        .await
        .unwrap();
}

/// Two tenants, each allowed only its own queue's tables: through the
/// schema, neither reads, plants or changes anything of the other's queue,
/// and each uses every feature on its own.
#[tokio::test]
async fn a_tenant_touches_only_its_own_queues() {
    let db = OwnDb::new("sdk_tenants").await;
    let owner = db.client().await;
    owner.install_sdk_schema().await.unwrap();
    let (qa, qb) = (
        QueueName::new("tenant_a").unwrap(),
        QueueName::new("tenant_b").unwrap(),
    );
    owner.create(&qa).await.unwrap();
    owner.create(&qb).await.unwrap();
    let (ra, rb) = (
        Role::new(&db, "ta", "").await,
        Role::new(&db, "tb", "").await,
    );
    let admin = common::raw_to(&db.dsn()).await;
    grant_queue(&admin, &qa, &ra.name).await;
    grant_queue(&admin, &qb, &rb.name).await;
    let (a, b) = (ra.client().await, rb.client().await);
    let hour = Duration::from_secs(3600);

    // B sends order 41 under a key; A sees none of B's keys.
    let k41 = DedupKey::new("order-41", hour);
    assert!(!b.send_keyed(&qb, &k41, &json!(41)).await.unwrap().duplicate);
    let a_raw = ra.raw().await;
    let seen: i64 = a_raw
        .query_one("SELECT count(*) FROM pgmq_sdk.queue_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 0, "tenant A read tenant B's keys");

    // A cannot plant a key for B's queue, directly or through the functions.
    let planted = a_raw
        .batch_execute(
            "INSERT INTO pgmq_sdk.queue_keys (queue_relid, key, msg_id, expires_at) \
             VALUES ('pgmq.q_tenant_b'::regclass, 'order-42', 1, now() + interval '1 hour')",
        )
        .await
        .unwrap_err();
    assert_eq!(
        planted.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{planted:?}"
    );
    let k42 = DedupKey::new("order-42", hour);
    let e = a.send_keyed(&qb, &k42, &json!("forged")).await.unwrap_err();
    assert!(is_denied(&e), "{e:?}");
    // B's order 42 is stored.
    let sent = b.send_keyed(&qb, &k42, &json!(42)).await.unwrap();
    assert!(!sent.duplicate, "tenant A's planted key swallowed B's send");
    let got = b.read_raw(&qb, Duration::from_secs(30), 10).await.unwrap();
    assert!(got.iter().any(|m| m.msg_id == sent.msg_id));

    // A can neither pause B's queue nor read or lift B's pause.
    let e = a.pause(&qb, Some("hostile")).await.unwrap_err();
    assert!(is_denied(&e), "{e:?}");
    assert!(b.pause(&qb, Some("maintenance")).await.unwrap());
    let e = a.is_paused(&qb).await.unwrap_err();
    assert!(is_denied(&e), "{e:?}");
    let e = a.resume(&qb).await.unwrap_err();
    assert!(is_denied(&e), "{e:?}");
    assert!(a.paused_queues().await.unwrap().is_empty());
    let lifted = a_raw
        .execute("DELETE FROM pgmq_sdk.paused", &[])
        .await
        .unwrap();
    assert_eq!(lifted, 0);
    assert!(b.is_paused(&qb).await.unwrap());
    // Nor B's limit state.
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(1);
    let e = a
        .read_limited_raw(&qb, &FleetLimit::max_running(1), &opts)
        .await
        .unwrap_err();
    assert!(is_denied(&e), "{e:?}");

    // A uses every feature on its own queue.
    assert!(!a.send_keyed(&qa, &k42, &json!(1)).await.unwrap().duplicate);
    assert!(a.send_keyed(&qa, &k42, &json!(1)).await.unwrap().duplicate);
    assert!(a.pause(&qa, None).await.unwrap());
    assert!(a.is_paused(&qa).await.unwrap());
    assert!(a.resume(&qa).await.unwrap());
    let got = a
        .read_limited_raw(&qa, &FleetLimit::max_running(1), &opts)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // Expiring keys deletes only expired rows, whoever calls it.
    a.expire_send_keys(100).await.unwrap();
    assert!(b.send_keyed(&qb, &k41, &json!(41)).await.unwrap().duplicate);
    drop((a, b, a_raw));
    drop((ra, rb));
}

/// The least rights of each feature: a producer with what pgmq.send needs
/// (INSERT and SELECT on the queue's table: the send returns the id)
/// sends with keys and reads the pause flag but cannot pause; a consumer
/// with what pgmq.read needs (SELECT, UPDATE) reads under a limit, reads
/// and sets the flag, and cannot send.
#[tokio::test]
async fn each_feature_works_with_the_rights_its_pgmq_operation_needs() {
    let db = OwnDb::new("sdk_least").await;
    let owner = db.client().await;
    owner.install_sdk_schema().await.unwrap();
    let q = QueueName::new("jobs").unwrap();
    owner.create(&q).await.unwrap();
    let (rp, rc) = (
        Role::new(&db, "producer", "").await,
        Role::new(&db, "consumer", "").await,
    );
    let admin = common::raw_to(&db.dsn()).await;
    let (t, a) = (q.table_name(), q.archive_table_name());
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA pgmq TO \"{p}\", \"{c}\";
             GRANT INSERT, SELECT ON pgmq.{t} TO \"{p}\";
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgmq TO \"{p}\";
             GRANT SELECT, UPDATE, DELETE ON pgmq.{t} TO \"{c}\";
             GRANT SELECT ON pgmq.meta TO \"{c}\";
             GRANT INSERT ON pgmq.{a} TO \"{c}\";",
            p = rp.name,
            c = rc.name
        ))
        .await
        .unwrap();
    let (producer, consumer) = (rp.client().await, rc.client().await);
    let key = DedupKey::new("k", Duration::from_secs(600));
    assert!(
        !producer
            .send_keyed(&q, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
    assert!(
        producer
            .send_keyed(&q, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
    assert!(is_denied(&producer.pause(&q, None).await.unwrap_err()));
    assert!(!producer.is_paused(&q).await.unwrap());

    producer.send(&q, &json!(3)).await.unwrap();
    assert!(!consumer.is_paused(&q).await.unwrap());
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(5);
    let one = FleetLimit::max_running(1);
    let got = consumer.read_limited_raw(&q, &one, &opts).await.unwrap();
    assert_eq!(got.len(), 1);
    // Acknowledging and claiming in one statement needs DELETE besides.
    let done = [got[0].receipt().unwrap()];
    let (deleted, next) = consumer
        .ack_read_limited_raw(&q, &done, &one, &opts)
        .await
        .unwrap();
    assert_eq!(deleted, [got[0].msg_id]);
    assert_eq!(next.len(), 1, "the place the delete freed");
    assert!(is_denied(
        &producer
            .ack_read_limited_raw(&q, &[], &one, &opts)
            .await
            .unwrap_err()
    ));
    assert!(is_denied(
        &consumer.send_keyed(&q, &key, &json!(2)).await.unwrap_err()
    ));
    // A limit per key needs what a claim needs: UPDATE on the queue.
    let per_key = KeyLimit::new(KeyFrom::header("k").unwrap(), FleetLimit::max_running(1));
    consumer
        .read_key_limited_raw(&q, &per_key, &opts)
        .await
        .unwrap();
    assert!(is_denied(
        &producer
            .read_key_limited_raw(&q, &per_key, &opts)
            .await
            .unwrap_err()
    ));
    drop((producer, consumer));
    drop((rp, rc));
}

/// A keyed send takes no lock on keys other than its own: a transaction
/// that sent another key (while expired keys were lying around) holds up
/// no send of an expired key.
#[tokio::test]
async fn a_keyed_send_never_waits_on_a_transaction_without_its_key() {
    let db = OwnDb::new("sdk_nowait").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    for k in ["stale-1", "stale-2", "stale-3"] {
        let key = DedupKey::new(k, Duration::from_millis(1));
        client.send_keyed(&q, &key, &json!(k)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut other = common::raw_to(&db.dsn()).await;
    let tx = other.transaction().await.unwrap();
    let pg = pgmq_client::Pgmq::on(&tx);
    let hour = Duration::from_secs(3600);
    pg.send_keyed(&q, &DedupKey::new("unrelated", hour), &json!(0))
        .await
        .unwrap();

    // The transaction stays open; sends of the expired keys go through.
    let fresh = db.client().await;
    for k in ["stale-1", "stale-2", "stale-3"] {
        let sent = tokio::time::timeout(
            Duration::from_secs(5),
            fresh.send_keyed(&q, &DedupKey::new(k, hour), &json!(k)),
        )
        .await
        .unwrap_or_else(|_| panic!("the send of {k} waited on a transaction without its key"))
        .unwrap();
        assert!(!sent.duplicate);
    }
    tx.rollback().await.unwrap();
}

/// Batches that share keys, with windows short enough that keys expire
/// and are taken over all the time, never deadlock.
#[tokio::test]
async fn batches_sharing_short_lived_keys_never_deadlock() {
    let db = OwnDb::new("sdk_deadlock").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let dsn = db.dsn();
        let q = q.clone();
        tasks.push(tokio::spawn(async move {
            let c = pgmq_client::ClientBuilder::new(&dsn)
                .max_size(1)
                .connect()
                .await
                .unwrap();
            let mut i = t;
            while std::time::Instant::now() < until {
                // Overlapping sets of keys, given in varying orders.
                let keys: Vec<String> = (0..3)
                    .map(|j| format!("k{}", (i * 7 + j * 5 + t) % 12))
                    .rev()
                    .collect();
                let bodies: Vec<_> = keys.iter().map(|k| json!(k)).collect();
                c.send_batch_keyed(
                    &q,
                    &keys,
                    Duration::from_millis(50),
                    &bodies,
                    &pgmq_client::SendOptions::new(),
                )
                .await
                .unwrap_or_else(|e| panic!("a keyed batch failed: {e}"));
                i += 1;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A queue's keys belong to its table: a queue dropped and created again,
/// or purged, stores a message sent again under a key it had before.
#[tokio::test]
async fn keys_do_not_outlive_their_queue_or_its_purge() {
    let db = OwnDb::new("sdk_rebirth").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    let key = DedupKey::new("order-1", Duration::from_secs(3600));
    let first = client.send_keyed(&q, &key, &json!(1)).await.unwrap();
    assert!(!first.duplicate);

    client.drop_queue(&q).await.unwrap();
    client.create(&q).await.unwrap();
    let again = client.send_keyed(&q, &key, &json!(1)).await.unwrap();
    assert!(
        !again.duplicate,
        "a key of the dropped queue answered for the new one"
    );
    let got = client
        .read_raw(&q, Duration::from_secs(1), 10)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].msg_id, again.msg_id);

    client.purge_queue(&q).await.unwrap();
    let third = client.send_keyed(&q, &key, &json!(1)).await.unwrap();
    assert!(
        !third.duplicate,
        "a key of purged messages answered after the purge"
    );
    assert_eq!(
        client
            .read_raw(&q, Duration::from_secs(1), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        client
            .send_keyed(&q, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
}

/// `DROP EXTENSION pgmq CASCADE` and a new `CREATE EXTENSION pgmq`, or a
/// function dropped by hand: running the install again puts back what is
/// missing, and the limited read works again.
#[tokio::test]
async fn the_install_repairs_what_was_dropped() {
    let db = OwnDb::new("sdk_repair").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let admin = common::raw_to(&db.dsn()).await;
    admin
        .batch_execute("DROP EXTENSION pgmq CASCADE; CREATE EXTENSION pgmq;")
        .await
        .unwrap();
    admin
        .batch_execute("DROP FUNCTION pgmq_sdk.pause_queue(text, text)")
        .await
        .unwrap();
    let client = db.client().await;
    let done = client.install_sdk_schema().await.unwrap();
    assert_eq!(
        (done.before, done.now),
        (
            pgmq_client::sdk_schema::VERSION,
            pgmq_client::sdk_schema::VERSION
        )
    );
    assert_eq!(
        done.repaired,
        vec!["pgmq_sdk.pause_queue(text, text)".to_owned()]
    );

    let q = QueueName::new("orders").unwrap();
    client.create(&q).await.unwrap();
    client.send(&q, &json!(1)).await.unwrap();
    let opts = ReadOptions::new(Duration::from_secs(30)).qty(5);
    let got = client
        .read_limited_raw(&q, &FleetLimit::max_running(1), &opts)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(client.pause(&q, None).await.unwrap());
    let again = client.install_sdk_schema().await.unwrap();
    assert!(again.repaired.is_empty());
}

/// `Orders` and `orders` are one PGMQ queue, so they share keys, the pause
/// flag and the fleet limit.
#[tokio::test]
async fn every_spelling_of_a_queue_shares_its_state() {
    let db = OwnDb::new("sdk_case").await;
    let client = db.client().await;
    client.install_sdk_schema().await.unwrap();
    let (upper, lower) = (
        QueueName::new("Orders").unwrap(),
        QueueName::new("orders").unwrap(),
    );
    client.create(&lower).await.unwrap();
    let key = DedupKey::new("order-1", Duration::from_secs(3600));
    assert!(
        !client
            .send_keyed(&upper, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
    assert!(
        client
            .send_keyed(&lower, &key, &json!(1))
            .await
            .unwrap()
            .duplicate
    );
    client.send(&lower, &json!(2)).await.unwrap();

    assert!(client.pause(&upper, None).await.unwrap());
    assert!(client.is_paused(&lower).await.unwrap());
    assert!(!client.pause(&lower, None).await.unwrap(), "paused twice");
    assert!(client.resume(&lower).await.unwrap());
    assert!(!client.is_paused(&upper).await.unwrap());

    let opts = ReadOptions::new(Duration::from_secs(30)).qty(5);
    let limit = FleetLimit::max_running(1);
    assert_eq!(
        client
            .read_limited_raw(&upper, &limit, &opts)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(client
        .read_limited_raw(&lower, &limit, &opts)
        .await
        .unwrap()
        .is_empty());
}

/// Only a queue table's owner may change its autovacuum settings or vacuum
/// it: a role allowed to send, read and acknowledge is told who owns the
/// table and changes nothing; a member of the owning role may.
#[tokio::test]
async fn only_the_owner_tunes_a_queue_tables_autovacuum() {
    let db = OwnDb::new("autovac_owner").await;
    let admin_client = db.client().await;
    let admin = common::raw_to(&db.dsn()).await;
    let q = QueueName::new("owned").unwrap();
    admin_client.create(&q).await.unwrap();
    let table = q.quoted_table();
    admin
        .batch_execute(&format!(
            "ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, \
             autovacuum_vacuum_threshold, autovacuum_vacuum_cost_delay)"
        ))
        .await
        .unwrap();
    let owner: String = common::scalar(&admin, "SELECT current_user::text", &[]).await;

    let tenant = Role::new(&db, "vac", "").await;
    grant_queue(&admin, &q, &tenant.name).await;
    let client = tenant.client().await;
    let seen = client.queue_table_autovacuum(&q).await.unwrap();
    assert!(!seen.caller_owns);
    assert_eq!(seen.owner, owner);
    match client.tune_autovacuum(&q).await {
        Err(Error::NotTableOwner { table, owner: o }) => {
            assert_eq!(
                (table.as_str(), o.as_str()),
                (q.table().as_str(), owner.as_str())
            );
        }
        other => panic!("a tenant tuned another role's table: {other:?}"),
    }
    assert!(
        matches!(
            client.vacuum_queue(&q).await,
            Err(Error::NotTableOwner { .. })
        ),
        "a tenant vacuumed another role's table"
    );
    assert!(admin_client
        .queue_table_autovacuum(&q)
        .await
        .unwrap()
        .settings
        .is_empty());

    admin
        .batch_execute(&format!("GRANT \"{owner}\" TO \"{}\"", tenant.name))
        .await
        .unwrap();
    let member = tenant.client().await;
    member.vacuum_queue(&q).await.unwrap();
    let tuned = member.tune_autovacuum(&q).await.unwrap();
    assert!(tuned.caller_owns);
    assert_eq!(
        tuned.settings.len(),
        pgmq_client::QUEUE_TABLE_AUTOVACUUM.len()
    );
}

/// Schedules follow the rights of their queue: a producer (INSERT) puts,
/// pauses and fires them; a consumer (SELECT, no INSERT) sees them but
/// cannot put, pause or fire them; a role without rights on the queue sees
/// none.
#[tokio::test]
async fn schedules_follow_the_rights_of_their_queue() {
    use pgmq_client::{Cadence, Schedule};
    let db = OwnDb::new("sdk_sched").await;
    let owner = db.client().await;
    owner.install_sdk_schema().await.unwrap();
    let q = QueueName::new("jobs").unwrap();
    owner.create(&q).await.unwrap();
    let (rp, rc, rs) = (
        Role::new(&db, "producer", "").await,
        Role::new(&db, "consumer", "").await,
        Role::new(&db, "stranger", "").await,
    );
    let admin = common::raw_to(&db.dsn()).await;
    let t = q.table_name();
    admin
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA pgmq TO \"{p}\", \"{c}\", \"{s}\";
             GRANT INSERT, SELECT ON pgmq.{t} TO \"{p}\";
             GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgmq TO \"{p}\";
             GRANT SELECT, UPDATE, DELETE ON pgmq.{t} TO \"{c}\";",
            p = rp.name,
            c = rc.name,
            s = rs.name
        ))
        .await
        .unwrap();
    let (producer, consumer, stranger) = (rp.client().await, rc.client().await, rs.client().await);
    let every = Cadence::every(Duration::from_millis(100)).unwrap();
    let s = Schedule::new("jobs-tick", q.clone(), every).unwrap();
    assert!(producer.put_schedule(&s).await.unwrap());
    assert!(is_denied(&consumer.put_schedule(&s).await.unwrap_err()));
    assert_eq!(consumer.schedules().await.unwrap().len(), 1);
    assert!(stranger.schedules().await.unwrap().is_empty());
    assert!(!consumer.pause_schedule("jobs-tick").await.unwrap());
    assert!(!stranger.remove_schedule("jobs-tick").await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Only a role that may send fires it.
    for other in [&consumer, &stranger] {
        for _ in 0..2 {
            assert!(other.fire_due_schedules(10).await.unwrap().sent.is_empty());
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    producer.fire_due_schedules(10).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let pass = producer.fire_due_schedules(10).await.unwrap();
    assert!(!pass.sent.is_empty(), "{pass:?}");
    assert!(producer.pause_schedule("jobs-tick").await.unwrap());
    assert!(producer.remove_schedule("jobs-tick").await.unwrap());
    drop((producer, consumer, stranger));
    drop((rp, rc, rs));
}

/// The workers' presence rows follow the rights on their queue: a tenant
/// reads and writes only the rows of queues it may consume from, and
/// cannot take over, block or delete another tenant's row by its worker
/// id (rows are keyed by queue and worker id).
#[tokio::test]
async fn presence_rows_follow_the_rights_of_their_queue() {
    use pgmq_client::WorkerPresence;
    let db = OwnDb::new("sdk_presence").await;
    let owner = db.client().await;
    owner.install_sdk_schema().await.unwrap();
    let (qa, qb) = (
        QueueName::new("presence_a").unwrap(),
        QueueName::new("presence_b").unwrap(),
    );
    owner.create(&qa).await.unwrap();
    owner.create(&qb).await.unwrap();
    let (ra, rb) = (
        Role::new(&db, "pa", "").await,
        Role::new(&db, "pb", "").await,
    );
    let admin = common::raw_to(&db.dsn()).await;
    grant_queue(&admin, &qa, &ra.name).await;
    grant_queue(&admin, &qb, &rb.name).await;
    let (a, b) = (ra.client().await, rb.client().await);
    // A writes a row of its own queue under the id a worker of B's queue is
    // about to report with: B's report still succeeds, A's row stays A's.
    let early = WorkerPresence::new("host-b:7:presence_b:0", "presence_a", "host-a", 1);
    a.report_presence(&early, false).await.unwrap();
    let wb = WorkerPresence::new("host-b:7:presence_b:0", "presence_b", "host-b", 7);
    b.report_presence(&wb, false).await.unwrap();
    assert_eq!(b.fleet(10).await.unwrap().len(), 1);
    let seen_by_a = a.fleet(10).await.unwrap();
    assert!(
        seen_by_a.iter().all(|w| w.queue_name == "presence_a"),
        "A read B's presence"
    );
    // A cannot write a row for B's queue, nor take B's row over by its id.
    let forged = WorkerPresence::new("host-a:1:presence_b:0", "presence_b", "host-a", 1);
    assert!(a.report_presence(&forged, false).await.is_err());
    // A's report under that id updates A's own row, never B's.
    let squat = WorkerPresence::new("host-b:7:presence_b:0", "presence_a", "host-a", 1);
    a.report_presence(&squat, true).await.unwrap();
    let mine = a.fleet(10).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].queue_name, "presence_a");
    let deleted = ra
        .raw()
        .await
        .execute(
            "DELETE FROM pgmq_sdk.workers WHERE queue_name = 'presence_b'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 0);
    let rows = b.fleet(10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].host.as_str(), rows[0].stopped_at),
        ("host-b", None)
    );
    drop((a, b));
    drop((ra, rb));
}
