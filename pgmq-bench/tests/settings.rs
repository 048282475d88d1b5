//! The document copies server settings from an allow-list only: a setting
//! the server reports that is not on it (here `search_path`, set with `ALTER
//! DATABASE` to a value that stands for an application's token, and
//! `application_name` set by the session) never reaches it, whatever its
//! name or source.

mod common;

use common::{run_on, smallest_run_args, temp_path, TempDb};
use serde_json::Value;

const DB_TOKEN: &str = "db_tok_7f3a9c1e";
const SESSION_TOKEN: &str = "session-tok-41d2b8";

#[test]
fn settings_outside_the_allow_list_never_reach_the_document() {
    let db = TempDb::new("settings");
    let name = db.query("SELECT current_database()").remove(0);
    db.query(&format!(
        "ALTER DATABASE {name} SET search_path = '{DB_TOKEN}', public"
    ));
    // A custom setting (an application's own `app.*`) as well, though the
    // server does not list such placeholders in pg_settings. Only a
    // superuser, or a role granted SET on it, may give a database one; the
    // throwaway cluster's role is neither, and then search_path stands alone.
    if let Err(e) = db.try_query(&format!(
        "ALTER DATABASE {name} SET app.api_token = '{DB_TOKEN}'"
    )) {
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{e}"
        );
        eprintln!("app.api_token not set: {e}");
    }
    // The server does report search_path to a new session, as a non-default
    // setting: a copy of every non-default setting would include it.
    assert_eq!(
        db.query("SELECT source || '=' || setting FROM pg_settings WHERE name = 'search_path'"),
        vec![format!("database={DB_TOKEN}, public")]
    );

    // The real binary on that database.
    let output = temp_path("settings.json");
    let out = run_on(&db.dsn, &smallest_run_args(output.to_str().unwrap()));
    let text = std::fs::read_to_string(&output)
        .unwrap_or_else(|e| panic!("{e}: stderr {}", String::from_utf8_lossy(&out.stderr)));
    assert!(!text.contains(DB_TOKEN), "the token is in the document");
    assert!(!text.contains("app.api_token") && !text.contains("search_path"));
    let doc: Value = serde_json::from_str(&text).unwrap();
    let names: Vec<&str> = doc["metadata"]["database"]["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for n in &names {
        assert!(
            pgmq_bench::metadata::is_recorded(n),
            "{n} is not on the allow-list"
        );
    }
    // The allow-list is read whatever the source: defaults too.
    for n in [
        "shared_buffers",
        "fsync",
        "autovacuum_naptime",
        "server_encoding",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    for leak in [
        "data_directory",
        "config_file",
        "hba_file",
        "listen_addresses",
        "port",
    ] {
        assert!(!names.contains(&leak), "{leak} recorded");
    }

    // The same through the library, on a session that set its own value.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&db.dsn, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "SET application_name = '{SESSION_TOKEN}'; SET pgmq_test.session_token = '{SESSION_TOKEN}'"
            ))
            .await
            .unwrap();
        let database = pgmq_bench::metadata::database(&client, "redacted".to_owned(), false, None)
            .await
            .unwrap();
        let seen: String = client
            .query_one(
                "SELECT setting FROM pg_settings WHERE name = 'application_name'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(seen, SESSION_TOKEN);
        let text = serde_json::to_string(&database).unwrap();
        assert!(!text.contains(SESSION_TOKEN), "{text}");
        assert!(!text.contains(DB_TOKEN), "{text}");
        assert!(database
            .settings
            .iter()
            .all(|s| pgmq_bench::metadata::is_recorded(&s.name)));
    });
}
