//! The `pgmq_sdk` schema: the objects this SDK keeps beside PGMQ's own, and
//! the step that installs or upgrades them.
//!
//! Idempotent sends ([`Pgmq::send_keyed`](crate::Pgmq::send_keyed)), pausing a queue
//! ([`Pgmq::pause`](crate::Pgmq::pause)) and the worker's fleet-wide limits store their state in
//! tables and functions of the schema `pgmq_sdk`, never in PGMQ's tables.
//! Nothing creates them implicitly: an operator (or a deploy step) runs
//! [`Client::install_sdk_schema`] or `pgmq install-sdk`, or applies the SQL
//! [`sql`] prints with their own migration tool. The step is versioned
//! ([`VERSION`]): running it again on an installed schema does nothing, and
//! on an older one applies the versions it lacks, each in one transaction
//! under an advisory lock, so two deploys running it at once do not race.
//! Remove it with `DROP SCHEMA pgmq_sdk CASCADE`.
//!
//! A call that needs the schema on a database without it fails with
//! [`Error::SdkSchemaMissing`], naming the feature and the install step.

use crate::client::Client;
use crate::error::Error;

/// The schema's name.
pub const SCHEMA: &str = "pgmq_sdk";

/// The schema version this crate installs and needs.
pub const VERSION: i32 = 1;

/// Each version's SQL, in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[include_str!("../sql/pgmq_sdk_v1.sql")];

/// The advisory lock key that serializes installs (`pgmq_sdk` as bytes).
const INSTALL_LOCK: i64 = 0x7067_6d71_5f73_646b;

/// The SQL of every version up to [`VERSION`], as one script for a
/// migration tool: each version in a transaction that records it in
/// `pgmq_sdk.schema_version`. Unlike [`Client::install_sdk_schema`] it does
/// not check what is installed: apply it to a database without the schema.
///
/// ```
/// let script = pgmq_client::sdk_schema::sql();
/// assert!(script.contains("CREATE SCHEMA IF NOT EXISTS pgmq_sdk"));
/// ```
pub fn sql() -> String {
    let mut out = String::new();
    for (i, m) in MIGRATIONS.iter().enumerate() {
        out.push_str("BEGIN;\n");
        out.push_str(m);
        out.push_str(&format!(
            "\nINSERT INTO pgmq_sdk.schema_version (version) VALUES ({});\nCOMMIT;\n",
            i + 1
        ));
    }
    out
}

/// What [`Client::install_sdk_schema`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Installed {
    /// The version installed before (0: none).
    pub before: i32,
    /// The version installed now ([`VERSION`]).
    pub now: i32,
}

impl Client {
    /// Installs the `pgmq_sdk` schema, or upgrades it to [`VERSION`]; does
    /// nothing when it is current. Needs PGMQ installed and the right to
    /// create a schema. See the [`sdk_schema`](crate::sdk_schema) module.
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
        pg.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock($1)",
            &[&INSTALL_LOCK],
        )
        .await
        .map_err(Error::from_pg)?;
        let before = installed_version(pg).await?;
        if before > VERSION {
            return Err(Error::Config(format!(
                "the database's pgmq_sdk schema is version {before}, newer than the {VERSION} \
                 this pgmq-client knows: upgrade pgmq-client"
            )));
        }
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
        tx.commit().await?;
        Ok(Installed {
            before,
            now: VERSION,
        })
    }

    /// The installed `pgmq_sdk` schema version; 0 when there is none.
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
        installed_version(conn.client()).await
    }
}

async fn installed_version<C: tokio_postgres::GenericClient>(pg: &C) -> Result<i32, Error> {
    let exists: bool = pg
        .query_one(
            "SELECT pg_catalog.to_regclass('pgmq_sdk.schema_version') IS NOT NULL",
            &[],
        )
        .await
        .map_err(Error::from_pg)?
        .get(0);
    if !exists {
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
