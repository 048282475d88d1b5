//! The SDK's own SQL calls catalog functions as `pg_catalog.f(...)`: a
//! function of the same name planted in a schema placed before `pg_catalog`
//! on the `search_path` is never called in their place.

mod common;

use std::time::Duration;

use pgmq_client::Client;
use serde_json::json;

/// A schema of look-alikes: a clock stuck in 2999, lookups that find
/// nothing.
async fn plant(pg: &tokio_postgres::Client, schema: &str) {
    pg.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE;
         CREATE SCHEMA {schema};
         CREATE FUNCTION {schema}.clock_timestamp() RETURNS timestamptz
             LANGUAGE sql AS $$ SELECT '2999-01-01'::timestamptz $$;
         CREATE FUNCTION {schema}.to_regclass(text) RETURNS regclass
             LANGUAGE sql AS $$ SELECT NULL::regclass $$;
         CREATE FUNCTION {schema}.current_database() RETURNS name
             LANGUAGE sql AS $$ SELECT 'planted'::name $$;"
    ))
    .await
    .unwrap();
}

fn with_search_path(dsn: &str, schema: &str) -> String {
    let sep = if dsn.contains('?') { '&' } else { '?' };
    format!("{dsn}{sep}options=-c%20search_path%3D{schema}%2Cpg_catalog%2Cpublic")
}

#[tokio::test]
async fn planted_catalog_functions_are_not_called() {
    let pg = common::raw().await;
    let schema = format!("t_planted_{}", std::process::id());
    plant(&pg, &schema).await;
    let result = async {
        let client = common::client().await;
        let queues = common::Queues::new();
        let q = queues.fresh(&client, "planted").await;
        let planted = Client::connect(&with_search_path(&common::dsn(), &schema))
            .await
            .expect("PGMQ detection does not use the planted functions");
        // The planted schema is in effect on that connection.
        let conn = planted.connection().await.unwrap();
        let row = conn
            .query_one("SELECT current_database()::text", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "planted");
        drop(conn);

        // release_batch: visible now, not in 2999.
        let id = client.send(&q, &json!(1)).await.unwrap();
        let read = client
            .read_raw(&q, Duration::from_secs(30), 1)
            .await
            .unwrap();
        let released = planted
            .release_batch(&q, &[(id, read[0].read_ct)])
            .await
            .unwrap();
        assert_eq!(released, [id]);
        let again = client
            .read_raw(&q, Duration::from_secs(30), 1)
            .await
            .unwrap();
        assert_eq!(again.len(), 1, "the released message is visible at once");

        // send: a delay of zero is counted from the real clock, so the
        // message is visible now, not in 2999.
        let sent = planted.send(&q, &json!(2)).await.unwrap();
        let visible = client
            .read_raw(&q, Duration::from_secs(30), 10)
            .await
            .unwrap();
        assert_eq!(
            visible.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
            [sent],
            "the message sent on the planted connection is visible at once"
        );
    }
    .await;
    pg.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    result
}
