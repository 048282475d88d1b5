//! The metadata measured at run time, on a real server: the `SELECT 1`
//! round trip, the storage under the data directory (without its path), and
//! the database clock's offset from this host's.

mod common;

use common::TempDb;

#[test]
fn measured_metadata_on_a_real_server() {
    let db = TempDb::new("meta");
    common::runtime().block_on(async {
        let client = common::connect(&db.dsn).await;

        let r = pgmq_bench::metadata::select1_round_trip(&client)
            .await
            .unwrap();
        assert_eq!(r.samples, pgmq_bench::metadata::ROUND_TRIP_SAMPLES);
        assert!(r.p50_us > 0.0 && r.p50_us <= r.p99_us, "{r:?}");
        assert!(r.mean_us > 0.0, "{r:?}");

        let st = pgmq_bench::metadata::storage(&client).await;
        // Either it was read, or it says why not.
        assert!(st.filesystem.is_some() || st.reason.is_some(), "{st:?}");
        let data_dir: String = client
            .query_one("SHOW data_directory", &[])
            .await
            .unwrap()
            .get(0);
        let database = pgmq_bench::metadata::database(&client, "redacted".into(), false, None)
            .await
            .unwrap();
        let text = serde_json::to_string(&database).unwrap();
        assert!(
            !text.contains(&data_dir),
            "the data directory's path is in {text}"
        );
        assert!(database.select1_round_trip.is_some() && database.storage.is_some());

        let on_this_host = std::path::Path::new(&data_dir).exists();
        if on_this_host {
            // A server on this host: its storage is read, and its clock is this host's.
            assert!(st.filesystem.is_some(), "{st:?}");
            let offset = pgmq_bench::sections::db_clock_offset_us(&client)
                .await
                .unwrap();
            assert!(offset.abs() < 50_000, "offset {offset} µs on one host");
        }
    });
}
