//! The setup scripts (scripts/db-start.sh, db-stop.sh) on a machine with
//! other local users, run for real as root on a spare port (55450-55459) in
//! a folder of their own:
//!
//! - a symlink planted where the cluster's folder goes is refused and left
//!   alone (and so is what it points to);
//! - a folder there owned by another user (`nobody`) is refused and left alone;
//! - a parent folder everyone may write, without the sticky bit, is refused;
//! - a cluster made by them has its DSN file at mode 0600, and its socket
//!   refuses another OS user (`nobody`, with psql) while the server's own
//!   user gets in; over TCP nobody gets in without the generated password;
//! - a port held by another process's outgoing connection (the ports lie in
//!   Linux's ephemeral range) delays the start instead of failing it, and
//!   the port ends up reserved against ephemeral use;
//! - a port that is not a number in 1024-65535 is refused before anything
//!   is written, and PGMQ_DB_RESERVE_PORTS=0 leaves the host's reserved
//!   ports alone;
//! - a fake server bound to the cluster's port while it is down (as the
//!   fault suite stops it) gets the DSN's password, and that password logs
//!   in as no superuser; the superuser has no TCP login at all;
//! - db-stop.sh signals the pid in PgBouncer's pid file (in a folder the
//!   server's OS user owns) only as that user: a planted pid of a root
//!   process survives.
//!
//! They need root (the scripts run the server as `postgres` and the tests
//! act as `nobody`) and PostgreSQL's binaries; without either each test
//! prints why it was skipped and passes.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts")
}

/// PostgreSQL's newest bin folder, as db-common.sh finds it.
fn pg_bin() -> Option<PathBuf> {
    let out = Command::new("bash")
        .args([
            "-c",
            "ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    dir.join("initdb").exists().then_some(dir)
}

/// Whether these tests can run here; prints why not.
fn can_run(test: &str) -> bool {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let why = if uid != "0" {
        "not root (the setup scripts run the server as postgres, and the test acts as nobody)"
    } else if pg_bin().is_none() {
        "PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin)"
    } else if !Command::new("id")
        .arg("nobody")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        "there is no user nobody"
    } else {
        return true;
    };
    eprintln!("SKIPPED {test}: {why}");
    false
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A fresh folder (0755, ours) for one test; on drop, the cluster in it is
/// stopped and the folder removed.
struct Sandbox {
    base: PathBuf,
    port: u16,
    db_dir: Option<PathBuf>,
}

impl Sandbox {
    fn new(tag: &str) -> Sandbox {
        let base = std::env::temp_dir().join(format!(
            "pgmq-setup-test-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        Sandbox {
            base,
            port: free_port(),
            db_dir: None,
        }
    }

    /// Runs scripts/`name` with PGMQ_DB_DIR = `dir` on this sandbox's port.
    fn script(&mut self, name: &str, dir: &Path) -> Output {
        self.script_with(name, dir, &[], &[])
    }

    /// [`script`](Self::script) with arguments and more environment.
    fn script_with(
        &mut self,
        name: &str,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Output {
        self.db_dir = Some(dir.to_owned());
        Command::new("bash")
            .arg(scripts().join(name))
            .args(args)
            .env("PGMQ_DB_PORT", self.port.to_string())
            .env("PGMQ_DB_DIR", dir)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(dir) = self.db_dir.take() {
            // Stops a cluster a failed assertion left running; refuses (and
            // does nothing) where the test planted something.
            let _ = Command::new("bash")
                .arg(scripts().join("db-stop.sh"))
                .env("PGMQ_DB_PORT", self.port.to_string())
                .env("PGMQ_DB_DIR", &dir)
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A port of the spare range 55450-55459 that no socket uses: bound
/// without `SO_REUSEADDR` (std's listener sets it, and would pass over a
/// port whose connections of an earlier cluster are still in TIME_WAIT,
/// which a test that binds a client socket to the port then trips on).
fn free_port() -> u16 {
    let start = 55450 + (std::process::id() % 10) as u16;
    (0..10)
        .map(|i| 55450 + (start - 55450 + i) % 10)
        .find(|&p| {
            tokio::net::TcpSocket::new_v4()
                .and_then(|s| s.bind(([127, 0, 0, 1], p).into()))
                .is_ok()
        })
        .expect("a free port in 55450-55459")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_refused(out: &Output, what: &str) {
    assert!(!out.status.success(), "{what} not refused: {}", text(out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing"), "{what}: {err}");
    assert!(out.stdout.is_empty(), "{what}: a DSN was printed");
}

/// Every file under `dir` with its owner, mode and content (a snapshot to
/// prove nothing changed).
fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = std::fs::symlink_metadata(e.path()).unwrap();
        let content = if m.is_file() {
            std::fs::read(e.path()).unwrap()
        } else {
            Vec::new()
        };
        out.push((e.path(), m.uid(), m.mode(), content));
    }
    out.sort();
    out
}

#[test]
fn a_symlink_at_the_cluster_folder_is_refused_and_left_alone() {
    if !can_run("a_symlink_at_the_cluster_folder_is_refused_and_left_alone") {
        return;
    }
    let mut sb = Sandbox::new("link");
    let target = sb.base.join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), "keep").unwrap();
    let link = sb.base.join("db");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let before = snapshot(&target);

    for script in ["db-start.sh", "db-stop.sh"] {
        let out = sb.script(script, &link);
        assert_refused(&out, script);
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_link(&link).unwrap(), target);
        assert_eq!(snapshot(&target), before, "{script} wrote through the link");
    }
    // A dangling one too (mkdir -p or a write would create its target).
    let missing = sb.base.join("not-yet");
    let dangling = sb.base.join("db2");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    assert_refused(&sb.script("db-start.sh", &dangling), "dangling link");
    assert!(!missing.exists(), "the link's target was created");
    assert!(std::fs::symlink_metadata(&dangling).is_ok());
}

#[test]
fn another_users_folder_is_refused_and_left_alone() {
    if !can_run("another_users_folder_is_refused_and_left_alone") {
        return;
    }
    let mut sb = Sandbox::new("theirs");
    let theirs = sb.base.join("db");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::create_dir(theirs.join("data")).unwrap();
    std::fs::write(theirs.join("dsn"), "theirs").unwrap();
    let (uid, gid) = (65534, 65534);
    for p in [theirs.join("data"), theirs.join("dsn"), theirs.clone()] {
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
    }
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = snapshot(&theirs);

    for script in ["db-start.sh", "db-stop.sh"] {
        let out = sb.script(script, &theirs);
        assert_refused(&out, script);
        let m = std::fs::symlink_metadata(&theirs).unwrap();
        assert!(m.is_dir() && m.uid() == uid && m.mode() & 0o777 == 0o700);
        assert_eq!(snapshot(&theirs), before, "{script} changed their folder");
    }
}

#[test]
fn a_world_writable_parent_without_the_sticky_bit_is_refused() {
    if !can_run("a_world_writable_parent_without_the_sticky_bit_is_refused") {
        return;
    }
    let mut sb = Sandbox::new("open");
    let open = sb.base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = sb.script("db-start.sh", &open.join("db"));
    assert_refused(&out, "world-writable parent");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sticky"),
        "{}",
        text(&out)
    );
    assert!(!open.join("db").exists(), "the folder was made anyway");
}

/// psql as `user` (from /, without any password source); its output.
fn psql_as(user: &str, args: &[&str]) -> Output {
    let psql = pg_bin().unwrap().join("psql");
    Command::new("runuser")
        .args(["-u", user, "--"])
        .arg(psql)
        .args(["-w", "-X", "-At", "-c", "SELECT 1"])
        .args(args)
        .current_dir("/")
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent/pgpass")
        .output()
        .unwrap()
}

#[test]
fn a_fresh_cluster_keeps_other_users_out() {
    if !can_run("a_fresh_cluster_keeps_other_users_out") {
        return;
    }
    let mut sb = Sandbox::new("real");
    let dir = sb.base.join("db");
    let port = sb.port.to_string();
    let out = sb.script("db-start.sh", &dir);
    assert!(out.status.success(), "db-start.sh: {}", text(&out));

    // The DSN file: a regular file of root's, mode 0600, holding what was printed.
    let dsn_file = dir.join("dsn");
    let m = std::fs::symlink_metadata(&dsn_file).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o7777, 0o600, "dsn file mode {:o}", m.mode());
    assert_eq!(m.uid(), 0);
    assert_eq!(std::fs::read(&dsn_file).unwrap(), out.stdout);
    // The folders: ours 0711, the server's 0700.
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o711);
    let run_dir = dir.join("run");
    let run = run_dir.to_str().unwrap();
    for sub in ["data", "run"] {
        assert_eq!(
            std::fs::metadata(dir.join(sub)).unwrap().mode() & 0o7777,
            0o700,
            "{sub}"
        );
    }

    // The server's own user gets in over the socket (so the refusals below
    // are about who asks, not a broken socket)...
    let ok = psql_as(
        "postgres",
        &["-h", run, "-p", &port, "-U", "postgres", "-d", "pgmq"],
    );
    assert!(ok.status.success(), "postgres: {}", text(&ok));
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "1");
    // ...another OS user does not, under any role name.
    for role in ["postgres", "pgmq", "nobody"] {
        let out = psql_as(
            "nobody",
            &["-h", run, "-p", &port, "-U", role, "-d", "pgmq"],
        );
        assert!(!out.status.success(), "nobody reached the socket as {role}");
    }
    // Over TCP, not without the generated password.
    let out = psql_as(
        "nobody",
        &["-h", "127.0.0.1", "-p", &port, "-U", "pgmq", "-d", "pgmq"],
    );
    assert!(!out.status.success(), "nobody got in over TCP");

    let out = sb.script("db-stop.sh", &dir);
    assert!(out.status.success(), "db-stop.sh: {}", text(&out));
    assert!(!dir.exists());
}

/// Whether `port` is in net.ipv4.ip_local_reserved_ports.
fn reserved(port: u16) -> bool {
    let list = read_reserved();
    list.trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .any(|item| {
            let (lo, hi) = item.split_once('-').unwrap_or((item, item));
            (lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&port)
        })
}

const RESERVED: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// The kernel's reserved-port list, read in one `read(2)`: the sysctl
/// answers a read only at offset 0, so `read_to_string`'s small first read
/// followed by a second one at its offset returns a list cut after 32 bytes.
fn read_reserved() -> String {
    use std::io::Read as _;
    let mut buf = vec![0u8; 1 << 16];
    let n = std::fs::File::open(RESERVED)
        .unwrap()
        .read(&mut buf)
        .unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// Held by the tests that change or check net.ipv4.ip_local_reserved_ports
/// (nextest runs each test in a process of its own): a listening socket
/// under an abstract unix name, which the kernel frees when the holder
/// exits, however it exits, and which leaves no file behind.
fn reserved_ports_lock() -> std::os::unix::net::UnixListener {
    use std::os::linux::net::SocketAddrExt;
    let name =
        std::os::unix::net::SocketAddr::from_abstract_name(b"pgmq-setup-test-reserved").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        match std::os::unix::net::UnixListener::bind_addr(&name) {
            Ok(l) => return l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the lock was never free"
                );
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(e) => panic!("lock: {e}"),
        }
    }
}

/// The reserved ports held ([`reserved_ports_lock`]) and as they were; put
/// back so on drop.
struct ReservedPorts {
    before: String,
    _lock: std::os::unix::net::UnixListener,
}

fn hold_reserved_ports() -> ReservedPorts {
    let lock = reserved_ports_lock();
    ReservedPorts {
        before: read_reserved(),
        _lock: lock,
    }
}

impl Drop for ReservedPorts {
    fn drop(&mut self) {
        if read_reserved() != self.before {
            let _ = std::fs::write(RESERVED, self.before.trim());
        }
    }
}

/// The kernel's list without `port` (ranges holding it split around it).
fn without(list: &str, port: u16) -> String {
    let mut out = Vec::new();
    for item in list.trim().split(',').filter(|s| !s.is_empty()) {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let (lo, hi): (u16, u16) = (lo.parse().unwrap(), hi.parse().unwrap());
        if !(lo..=hi).contains(&port) {
            out.push(item.to_owned());
            continue;
        }
        for (a, b) in [(lo, port.saturating_sub(1)), (port + 1, hi)] {
            match a.cmp(&b) {
                std::cmp::Ordering::Less => out.push(format!("{a}-{b}")),
                std::cmp::Ordering::Equal => out.push(a.to_string()),
                std::cmp::Ordering::Greater => {}
            }
        }
    }
    out.join(",")
}

#[test]
fn a_bad_port_is_refused_before_anything_is_written() {
    if !can_run("a_bad_port_is_refused_before_anything_is_written") {
        return;
    }
    let held = hold_reserved_ports();
    let before = held.before.clone();
    let sb = Sandbox::new("badport");
    let dir = sb.base.join("db");
    for port in ["55451,40000-40010", "4o000", "80", "70000", "055451", "-1"] {
        for script in [
            "db-start.sh",
            "db-ctl.sh",
            "db-stop.sh",
            "pgbouncer-start.sh",
        ] {
            let out = Command::new("bash")
                .arg(scripts().join(script))
                .arg("status")
                .env("PGMQ_DB_PORT", port)
                .env("PGMQ_DB_DIR", &dir)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{script} {port:?}: {err}");
            assert!(err.contains("not a port number in 1024-65535"), "{err}");
            assert!(out.stdout.is_empty());
            assert!(!dir.exists(), "{script} {port:?} made the folder");
            assert_eq!(
                read_reserved(),
                before,
                "{script} {port:?} changed the reserved ports"
            );
        }
    }
    let out = Command::new("bash")
        .arg(scripts().join("pgbouncer-start.sh"))
        .env("PGMQ_DB_DIR", &dir)
        .env("PGMQ_PGBOUNCER_PORT", "6432,1-2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!dir.exists());
}

#[test]
fn reserving_ports_can_be_turned_off_and_says_what_it_changed() {
    if !can_run("reserving_ports_can_be_turned_off_and_says_what_it_changed") {
        return;
    }
    let held = hold_reserved_ports();
    let before = held.before.clone();
    let mut sb = Sandbox::new("noreserve");
    let dir = sb.base.join("db");
    let port = sb.port;
    // This test's port alone taken out of the list (restored at the end).
    std::fs::write(RESERVED, without(&before, port)).unwrap();
    assert!(!reserved(port));

    let out = sb.script_with("db-start.sh", &dir, &[], &[("PGMQ_DB_RESERVE_PORTS", "0")]);
    assert!(out.status.success(), "db-start.sh: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PGMQ_DB_RESERVE_PORTS=0: leaving"), "{err}");
    assert!(!reserved(port), "port {port} reserved despite the opt-out");

    // Without it, the port is reserved and the change logged, old and new.
    let out = sb.script_with("db-ctl.sh", &dir, &["kill"], &[]);
    assert!(out.status.success(), "db-ctl.sh kill: {}", text(&out));
    let out = sb.script_with("db-ctl.sh", &dir, &["start"], &[]);
    assert!(out.status.success(), "db-ctl.sh start: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reserved ports ")
            && err.contains("against ephemeral use")
            && err.contains("was '")
            && err.contains("PGMQ_DB_RESERVE_PORTS=0"),
        "{err}"
    );
    assert!(reserved(port));
    let out = sb.script("db-stop.sh", &dir);
    assert!(out.status.success(), "db-stop.sh: {}", text(&out));
}

/// A fake PostgreSQL server on `listener`: asks the first client for its
/// password in clear text and returns what it sent.
fn fake_server(listener: std::net::TcpListener) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let read_packet = |s: &mut std::net::TcpStream| {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut body).unwrap();
            body
        };
        // An SSLRequest or GSSENCRequest first: neither here.
        let mut startup = read_packet(&mut s);
        while startup[..4] == 80877103u32.to_be_bytes() || startup[..4] == 80877104u32.to_be_bytes()
        {
            s.write_all(b"N").unwrap();
            startup = read_packet(&mut s);
        }
        assert_eq!(
            startup[..4],
            196608u32.to_be_bytes(),
            "not a startup packet"
        );
        // AuthenticationCleartextPassword.
        s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3]).unwrap();
        let mut tag = [0u8; 1];
        s.read_exact(&mut tag).unwrap();
        assert_eq!(tag[0], b'p');
        let body = read_packet(&mut s);
        String::from_utf8(body.split(|b| *b == 0).next().unwrap().to_vec()).unwrap()
    })
}

/// A sandbox with a cluster started in its folder `db`: the sandbox, the
/// folder and the DSN printed.
fn started(tag: &str) -> (Sandbox, PathBuf, String) {
    let mut sb = Sandbox::new(tag);
    let dir = sb.base.join("db");
    let out = sb.script("db-start.sh", &dir);
    assert!(out.status.success(), "db-start.sh: {}", text(&out));
    let dsn = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    (sb, dir, dsn)
}

/// psql (as root, no password source but `dsn`) running `sql`; its output.
fn psql_dsn(dsn: &str, sql: &str) -> Output {
    Command::new(pg_bin().unwrap().join("psql"))
        .args(["-w", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql, dsn])
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent/pgpass")
        .current_dir("/")
        .output()
        .unwrap()
}

#[test]
fn a_fake_server_on_the_port_while_it_is_down_gets_no_superuser_login() {
    let test = "a_fake_server_on_the_port_while_it_is_down_gets_no_superuser_login";
    if !can_run(test) {
        return;
    }
    let (mut sb, dir, dsn) = started("fake");
    let port = sb.port;
    // What the tests, the benchmark and the fault suite do with it works.
    let db = format!("pgmq_setup_probe_{}", std::process::id());
    for sql in [
        format!("CREATE DATABASE {db}"),
        format!("DROP DATABASE {db}"),
        "ALTER SYSTEM SET default_transaction_read_only = on".to_owned(),
        "SELECT pg_reload_conf()".to_owned(),
        "ALTER SYSTEM RESET default_transaction_read_only".to_owned(),
        "SELECT pg_reload_conf()".to_owned(),
        "SELECT pgmq.create('probe'); SELECT pgmq.drop_queue('probe')".to_owned(),
        "SELECT current_setting('data_directory')".to_owned(),
    ] {
        let out = psql_dsn(&dsn, &sql);
        assert!(out.status.success(), "{sql}: {}", text(&out));
    }

    // The server goes down (as the fault suite takes it down); another
    // local user binds its port and asks the next client for its password.
    let out = sb.script_with("db-ctl.sh", &dir, &["kill"], &[]);
    assert!(out.status.success(), "db-ctl.sh kill: {}", text(&out));
    let fake = fake_server(std::net::TcpListener::bind(("127.0.0.1", port)).unwrap());
    let _ = psql_dsn(&dsn, "SELECT 1");
    let captured = fake.join().unwrap();
    assert!(
        dsn.contains(&format!(":{captured}@")),
        "the fake server got no password"
    );

    // Replayed, that password logs in, as no superuser.
    let out = sb.script_with("db-ctl.sh", &dir, &["start"], &[]);
    assert!(out.status.success(), "db-ctl.sh start: {}", text(&out));
    let replayed = format!("postgres://pgmq:{captured}@127.0.0.1:{port}/pgmq");
    let out = psql_dsn(
        &replayed,
        "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "f",
        "the DSN's role is a superuser"
    );
    // No superuser has a password, and pg_hba refuses the superuser over TCP.
    let run_dir = dir.join("run");
    let p = port.to_string();
    let sock = [
        "-h",
        run_dir.to_str().unwrap(),
        "-p",
        &p,
        "-U",
        "postgres",
        "-d",
        "pgmq",
    ];
    let count = [
        "-c",
        "SELECT count(*) FROM pg_authid WHERE rolsuper AND rolpassword IS NOT NULL",
    ];
    let out = psql_as("postgres", &[&sock[..], &count[..]].concat());
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().last(),
        Some("0")
    );
    let out = psql_as(
        "postgres",
        &["-h", "127.0.0.1", "-p", &p, "-U", "postgres", "-d", "pgmq"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pg_hba.conf rejects"),
        "{}",
        text(&out)
    );

    let out = sb.script("db-stop.sh", &dir);
    assert!(out.status.success(), "db-stop.sh: {}", text(&out));
}

#[test]
fn db_stop_signals_a_planted_pgbouncer_pid_only_as_the_servers_user() {
    let test = "db_stop_signals_a_planted_pgbouncer_pid_only_as_the_servers_user";
    if !can_run(test) {
        return;
    }
    let (mut sb, dir, _) = started("pidfile");
    // A process of root's, and its pid written where PgBouncer's goes by
    // the server's OS user (who owns that folder).
    let mut victim = Command::new("sleep").arg("300").spawn().unwrap();
    let bouncer = dir.join("run/pgbouncer");
    let planted = Command::new("runuser")
        .args(["-u", "postgres", "--", "sh", "-c"])
        .arg(r#"mkdir -p "$1" && echo "$2" > "$1/pgbouncer.pid""#)
        .args(["sh", bouncer.to_str().unwrap(), &victim.id().to_string()])
        .current_dir("/")
        .output()
        .unwrap();
    assert!(planted.status.success(), "{}", text(&planted));

    let out = sb.script("db-stop.sh", &dir);
    let alive = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(out.status.success(), "db-stop.sh: {}", text(&out));
    assert!(
        alive,
        "db-stop.sh killed root's process named in the pid file"
    );
    assert!(!dir.exists());
}

#[test]
fn a_port_held_by_an_outgoing_connection_delays_the_start_but_does_not_fail_it() {
    let test = "a_port_held_by_an_outgoing_connection_delays_the_start_but_does_not_fail_it";
    if !can_run(test) {
        return;
    }
    let _held = hold_reserved_ports();
    let mut sb = Sandbox::new("held");
    let dir = sb.base.join("db");
    // A client connection whose local port is the cluster's port, as an
    // outgoing connection that the kernel gave that ephemeral port would
    // be; closed with a reset (no TIME_WAIT) once the server has failed to
    // bind it (initdb comes first, and its time varies with the load).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = sb.port;
    let (listener, client) = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 1], port).into()).unwrap();
        let client = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        (listener, client)
    });
    let log = dir.join("run/postgres.log");
    let release = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline
            && !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Address already in use"))
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        client.set_zero_linger().unwrap();
        rt.block_on(async move { drop(client) });
        drop(listener);
    });
    let out = sb.script("db-start.sh", &dir);
    release.join().unwrap();
    assert!(out.status.success(), "db-start.sh: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("held by another socket"),
        "no wait was reported: {err}"
    );
    assert!(
        reserved(port),
        "port {port} is not reserved against ephemeral use"
    );

    let out = sb.script("db-stop.sh", &dir);
    assert!(out.status.success(), "db-stop.sh: {}", text(&out));
}
