//! Whether the `pgmq_sdk` schema may be run: who owns it and what is in
//! it, read from the catalogs before a connection first runs anything of
//! it (see [`crate::sdk::sdk_schema`], "Trust"), and by the install step.

use tokio_postgres::GenericClient;

use crate::conn::error::Error;

/// Who owns the `pgmq_sdk` schema and what is in it, from the catalogs
/// only (nothing of the schema is run). One row when the schema exists:
/// its owner; whether that is the current user; whether the current user
/// may trust it (the user itself, a role it is a member of unless it is a
/// superuser, a superuser, or the owner of the `pgmq` extension); and what
/// in it another role owns or may create, as text (NULL: nothing).
const TRUST_SQL: &str = "SELECT n.nspowner::pg_catalog.regrole::text AS owner, \
        n.nspowner = u.oid AS owner_is_me, \
        (n.nspowner = u.oid OR o.rolsuper \
          OR n.nspowner = (SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'pgmq') \
          OR (NOT u.rolsuper AND pg_catalog.pg_has_role(u.oid, n.nspowner, 'MEMBER'))) AS trusted, \
        (SELECT pg_catalog.string_agg(x.what, ', ' ORDER BY x.what) FROM ( \
          SELECT 'table ' || c.oid::pg_catalog.regclass::text || ' owned by ' || c.relowner::pg_catalog.regrole::text AS what \
            FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid AND c.relowner <> n.nspowner \
          UNION ALL SELECT 'function ' || p.oid::pg_catalog.regprocedure::text || ' owned by ' || p.proowner::pg_catalog.regrole::text \
            FROM pg_catalog.pg_proc p WHERE p.pronamespace = n.oid AND p.proowner <> n.nspowner \
          UNION ALL SELECT 'type ' || t.oid::pg_catalog.regtype::text || ' owned by ' || t.typowner::pg_catalog.regrole::text \
            FROM pg_catalog.pg_type t WHERE t.typnamespace = n.oid AND t.typowner <> n.nspowner \
          UNION ALL SELECT 'operator ' || op.oid::pg_catalog.regoperator::text || ' owned by ' || op.oprowner::pg_catalog.regrole::text \
            FROM pg_catalog.pg_operator op WHERE op.oprnamespace = n.oid AND op.oprowner <> n.nspowner \
          UNION ALL SELECT 'CREATE on the schema granted to ' \
              || CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END \
            FROM pg_catalog.aclexplode(n.nspacl) a WHERE a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner \
        ) x) AS foreign_objects \
        FROM pg_catalog.pg_namespace n \
        JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner \
        CROSS JOIN (SELECT r.oid, r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER) u \
        WHERE n.nspname = 'pgmq_sdk'";

/// Who owns the schema and what is in it, as [`check`] and the install
/// read it.
pub(crate) struct Found {
    pub(crate) owner: String,
    pub(crate) owner_is_me: bool,
    pub(crate) trusted: bool,
    pub(crate) foreign_objects: Option<String>,
}

/// What the catalogs say of the schema; None when there is none.
pub(crate) async fn find<C: GenericClient + Sync>(pg: &C) -> Result<Option<Found>, Error> {
    let rows = pg
        .query_typed(TRUST_SQL, &[])
        .await
        .map_err(Error::from_pg)?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let col = |e: tokio_postgres::Error| Error::UnexpectedRow { source: e };
    Ok(Some(Found {
        owner: r.try_get(0).map_err(col)?,
        owner_is_me: r.try_get(1).map_err(col)?,
        trusted: r.try_get(2).map_err(col)?,
        foreign_objects: r.try_get(3).map_err(col)?,
    }))
}

/// Checks that the `pgmq_sdk` schema may be run by the connected user. A
/// database without the schema passes: the call then fails as
/// [`Error::SdkSchemaMissing`].
pub(crate) async fn check<C: GenericClient + Sync>(pg: &C) -> Result<(), Error> {
    let Some(found) = find(pg).await? else {
        return Ok(());
    };
    if !found.trusted {
        return Err(Error::SdkSchemaUntrusted {
            reason: format!(
                "it is owned by role {}, which the connected user does not trust",
                found.owner
            ),
        });
    }
    if let Some(objects) = found.foreign_objects {
        return Err(Error::SdkSchemaUntrusted {
            reason: format!("owner {}; found {objects}", found.owner),
        });
    }
    Ok(())
}
