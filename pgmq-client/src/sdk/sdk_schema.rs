//! The `pgmq_sdk` schema: the objects this SDK keeps beside PGMQ's own, the
//! step that installs, upgrades and repairs them, and the check that they
//! can be trusted before anything of them runs.
//!
//! Idempotent sends ([`Pgmq::send_keyed`](crate::Pgmq::send_keyed)), pausing a queue
//! ([`Pgmq::pause`](crate::Pgmq::pause)), the worker's fleet-wide limits and
//! periodic sends ([`Pgmq::put_schedule`](crate::Pgmq::put_schedule)) store their state in
//! tables and functions of the schema `pgmq_sdk`, never in PGMQ's tables.
//! Nothing creates them implicitly: an operator (or a deploy step) runs
//! [`Client::install_sdk_schema`] or `pgmq install-sdk`, or applies the SQL
//! [`sql`] prints with their own migration tool. Remove it with
//! `DROP SCHEMA pgmq_sdk CASCADE`.
//!
//! # Install, upgrade, repair
//!
//! The tables are versioned ([`VERSION`]): the install applies the versions
//! the database lacks, in one transaction under an advisory lock, so two
//! deploys running it at once do not race. It then creates or replaces
//! every function, row-level security policy and grant of the current
//! version, so running it again repairs what was dropped or changed (a
//! `DROP EXTENSION pgmq CASCADE`, a function replaced by hand); [`Installed`]
//! names what it had to put back.
//!
//! # Trust
//!
//! Whoever owns the schema decides what its functions do, and they run with
//! the caller's rights. So:
//!
//! - the install creates the schema itself, or uses one the installing
//!   role owns; it refuses a schema owned by another role, one holding an
//!   object another role owns, or one where another role may create
//!   objects ([`Error::SdkSchemaUntrusted`]), and reads the installed
//!   version only from a table it owns;
//! - before a connection first runs anything of the schema, it checks the
//!   same from the catalogs: the owner must be the connected user, a role
//!   it is a member of, a superuser, or the owner of the `pgmq` extension,
//!   and nothing in the schema may belong to another role. A failed check
//!   runs nothing and says why.
//!
//! What each feature needs of a role (it is what PGMQ's own operation
//! needs, checked on the queue's table) is in the row-level security
//! policies of the installed SQL, and in the repository's docs/security.md.

use tokio_postgres::GenericClient;

use crate::conn::client::Client;
use crate::conn::error::Error;
use crate::conn::sdk_trust::{check as check_trust, find};

/// The schema's name.
pub const SCHEMA: &str = "pgmq_sdk";

/// The schema version this crate installs and needs.
pub const VERSION: i32 = 11;

/// Each version's table changes, in order: version `i + 1` is
/// `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../sql/pgmq_sdk_v1.sql"),
    include_str!("../../sql/pgmq_sdk_v2.sql"),
    include_str!("../../sql/pgmq_sdk_v3.sql"),
    include_str!("../../sql/pgmq_sdk_v4.sql"),
    include_str!("../../sql/pgmq_sdk_v5.sql"),
    include_str!("../../sql/pgmq_sdk_v6.sql"),
    include_str!("../../sql/pgmq_sdk_v7.sql"),
    include_str!("../../sql/pgmq_sdk_v8.sql"),
    include_str!("../../sql/pgmq_sdk_v9.sql"),
    include_str!("../../sql/pgmq_sdk_v10.sql"),
    include_str!("../../sql/pgmq_sdk_v11.sql"),
];

/// The functions, policies and grants of [`VERSION`], applied on every
/// install.
const OBJECTS: &str = include_str!("../../sql/pgmq_sdk_objects.sql");

/// The functions [`OBJECTS`] creates, by signature: what an install
/// reports as repaired when one was missing.
const FUNCTIONS: &[&str] = &[
    "pgmq_sdk.queue_table(text)",
    "pgmq_sdk.require(oid, text, text)",
    "pgmq_sdk.send_keyed(text, text, jsonb, jsonb, timestamptz, interval)",
    "pgmq_sdk.send_batch_keyed(text, text[], jsonb[], jsonb[], timestamptz, interval)",
    "pgmq_sdk.send_topic_keyed(text, text, jsonb, jsonb, integer, interval)",
    "pgmq_sdk.expire_keys(integer)",
    "pgmq_sdk.forget_queue_keys(text)",
    "pgmq_sdk.pause_queue(text, text)",
    "pgmq_sdk.resume_queue(text)",
    "pgmq_sdk.queue_paused(text)",
    "pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision)",
    "pgmq_sdk.ack_read_limited(text, bigint[], timestamptz[], integer, integer, integer, double precision, double precision)",
    "pgmq_sdk.put_schedule(text, text, text, text, interval, jsonb, jsonb, integer)",
    "pgmq_sdk.pause_schedule(text, boolean)",
    "pgmq_sdk.remove_schedule(text)",
    "pgmq_sdk.due_schedules(integer)",
    "pgmq_sdk.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz)",
    "pgmq_sdk.read_key_limited(text, integer, integer, boolean, text[], integer, double precision, double precision)",
];

/// The advisory lock key that serializes installs (`pgmq_sdk` as bytes).
const INSTALL_LOCK: i64 = 0x7067_6d71_5f73_646b;

/// The SQL of every version up to [`VERSION`] and of its functions, as one
/// script for a migration tool, in one transaction that records the
/// version in `pgmq_sdk.schema_version`. Unlike
/// [`Client::install_sdk_schema`] it checks nothing first: apply it, as the
/// role that should own the schema, to a database without it. Its
/// `CREATE SCHEMA` fails when a schema of that name exists.
///
/// ```
/// let script = pgmq_client::sdk_schema::sql();
/// assert!(script.starts_with("BEGIN;\nSET LOCAL search_path = pg_catalog, pg_temp;\nCREATE SCHEMA pgmq_sdk;"));
/// ```
pub fn sql() -> String {
    let mut out = String::from(
        "BEGIN;\nSET LOCAL search_path = pg_catalog, pg_temp;\nCREATE SCHEMA pgmq_sdk;\n",
    );
    for (i, m) in MIGRATIONS.iter().enumerate() {
        out.push_str(m);
        out.push_str(&format!(
            "\nINSERT INTO pgmq_sdk.schema_version (version) VALUES ({});\n",
            i + 1
        ));
    }
    out.push_str(OBJECTS);
    out.push_str("\nCOMMIT;\n");
    out
}

/// What [`Client::install_sdk_schema`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Installed {
    /// The version installed before (0: none).
    pub before: i32,
    /// The version installed now ([`VERSION`]).
    pub now: i32,
    /// The functions an installed schema lacked and the install put back
    /// (empty on a fresh install or upgrade), by signature.
    pub repaired: Vec<String>,
}

impl Client {
    /// Installs the `pgmq_sdk` schema, upgrades it to [`VERSION`], and
    /// creates again any of its functions, policies and grants that are
    /// missing or changed (see the [`sdk_schema`](crate::sdk::sdk_schema)
    /// module). Needs PGMQ installed and, for a first install, the right
    /// to create a schema; the installing role owns the schema. Refuses,
    /// with [`Error::SdkSchemaUntrusted`] and nothing changed, a schema
    /// owned by another role or holding another role's objects.
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// let done = client.install_sdk_schema().await?;
    /// println!("pgmq_sdk version {} (was {})", done.now, done.before);
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "pgmq_sdk.install", skip_all)]
    pub async fn install_sdk_schema(&self) -> Result<Installed, Error> {
        let mut conn = self.connection().await?;
        let tx = conn.transaction().await?;
        let pg: &tokio_postgres::Transaction<'_> = &tx;
        pg.batch_execute("SET LOCAL search_path = pg_catalog, pg_temp")
            .await
            .map_err(Error::from_pg)?;
        pg.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock($1)",
            &[&INSTALL_LOCK],
        )
        .await
        .map_err(Error::from_pg)?;
        let before = match find(pg).await? {
            None => {
                pg.batch_execute("CREATE SCHEMA pgmq_sdk")
                    .await
                    .map_err(Error::from_pg)?;
                0
            }
            Some(found) => {
                if !found.owner_is_me {
                    return Err(Error::SdkSchemaUntrusted {
                        reason: format!(
                            "it is owned by role {}, not by the installing role: install as {} \
                             or drop the schema",
                            found.owner, found.owner
                        ),
                    });
                }
                if let Some(objects) = found.foreign_objects {
                    return Err(Error::SdkSchemaUntrusted {
                        reason: format!("found {objects}"),
                    });
                }
                installed_version(pg).await?
            }
        };
        if before > VERSION {
            return Err(Error::Config(format!(
                "the database's pgmq_sdk schema is version {before}, newer than the {VERSION} \
                 this pgmq-client knows: upgrade pgmq-client"
            )));
        }
        let missing = if before == VERSION {
            missing_functions(pg).await?
        } else {
            Vec::new()
        };
        for (i, m) in MIGRATIONS.iter().enumerate().skip(before.max(0) as usize) {
            pg.batch_execute(m).await.map_err(Error::from_pg)?;
            let v = i as i32 + 1;
            pg.execute(
                "INSERT INTO pgmq_sdk.schema_version (version) VALUES ($1)",
                &[&v],
            )
            .await
            .map_err(Error::from_pg)?;
        }
        pg.batch_execute(OBJECTS).await.map_err(Error::from_pg)?;
        tx.commit().await?;
        Ok(Installed {
            before,
            now: VERSION,
            repaired: missing,
        })
    }

    /// The installed `pgmq_sdk` schema version; 0 when there is none.
    /// Fails with [`Error::SdkSchemaUntrusted`] when the schema found
    /// cannot be trusted (its version table is then not read).
    ///
    /// ```no_run
    /// # async fn f(client: pgmq_client::Client) -> Result<(), pgmq_client::Error> {
    /// if client.sdk_schema_version().await? < pgmq_client::sdk_schema::VERSION {
    ///     client.install_sdk_schema().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn sdk_schema_version(&self) -> Result<i32, Error> {
        let conn = self.connection().await?;
        let pg = conn.client();
        if find(pg).await?.is_none() {
            return Ok(0);
        }
        check_trust(pg).await?;
        installed_version(pg).await
    }
}

/// The version recorded in the schema's own `schema_version` table (a
/// table, not a view or anything else of that name); 0 without one. Call
/// it only on a schema found trustworthy.
async fn installed_version<C: GenericClient + Sync>(pg: &C) -> Result<i32, Error> {
    let table: bool = pg
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'pgmq_sdk' AND c.relname = 'schema_version' AND c.relkind = 'r')",
            &[],
        )
        .await
        .map_err(Error::from_pg)?
        .get(0);
    if !table {
        return Ok(0);
    }
    let v: Option<i32> = pg
        .query_one(
            "SELECT pg_catalog.max(version) FROM pgmq_sdk.schema_version",
            &[],
        )
        .await
        .map_err(Error::from_pg)?
        .get(0);
    Ok(v.unwrap_or(0))
}

/// The functions of [`FUNCTIONS`] the database lacks.
async fn missing_functions<C: GenericClient + Sync>(pg: &C) -> Result<Vec<String>, Error> {
    let names: Vec<&str> = FUNCTIONS.to_vec();
    let rows = pg
        .query(
            "SELECT f FROM pg_catalog.unnest($1::text[]) AS f \
             WHERE pg_catalog.to_regprocedure(f) IS NULL",
            &[&names],
        )
        .await
        .map_err(Error::from_pg)?;
    Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
}
