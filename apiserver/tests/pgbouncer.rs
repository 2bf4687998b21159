//! The store behind PgBouncer in session pooling mode (issue 30, docs/operations.md): the pool
//! and the change feed's LISTEN connection both go through it, writes and lists work, every
//! write reaches a watcher in order, and when PgBouncer is killed and started again the store
//! reconnects by itself and the watcher goes on without a gap and without a relist.
//!
//! This is also what keeps the session limits off the startup packet: PgBouncer refuses a
//! startup `options` parameter, so a store that sent its timeouts there could not connect.
//!
//! Needs (set by `hack/test.sh`): `pgbouncer` (`MCP_ACCESS_PGBOUNCER_BIN`).

mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apis::AccessSession;
use apiserver::store::{EventType, ListQuery, PgStore, Store, StoreConfig, Subscription};
use futures::TryStreamExt;
use support::*;

const NS: &str = "pooled";

/// A PgBouncer of the test's own, in session mode, in front of the test database's server.
struct Bouncer {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Bouncer {
    fn start(server: &tokio_postgres::Config) -> Self {
        let dir = std::env::temp_dir().join(format!("mcp-access-pgb-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let host = match &server.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("the test database is reached over TCP, not {other:?}"),
        };
        let user = server.get_user().expect("the test DSN names a user");
        let ini = format!(
            "[databases]\n* = host={host} port={port}\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {dir}/users.txt\npool_mode = session\n\
             max_client_conn = 200\ndefault_pool_size = 100\nadmin_users = {user}\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            port = server.get_ports()[0],
            listen = free_port(),
            dir = dir.display(),
        );
        let listen = ini
            .lines()
            .find_map(|l| l.strip_prefix("listen_port = "))
            .unwrap()
            .parse()
            .unwrap();
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let mut bouncer = Self {
            dir,
            port: listen,
            child: None,
        };
        bouncer.run();
        bouncer
    }

    /// Starts the process (again) on the same port, and waits until it accepts connections.
    fn run(&mut self) {
        let bin = std::env::var("MCP_ACCESS_PGBOUNCER_BIN")
            .expect("MCP_ACCESS_PGBOUNCER_BIN (hack/ensure-pgbouncer.sh; hack/test.sh sets it)");
        let ini = self.dir.join("pgbouncer.ini");
        // PgBouncer refuses to run as root: as root, it runs as the postgres user (whose
        // server it fronts), as hack/lib/postgres.sh runs PostgreSQL.
        let mut command = if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&self.dir)
                .status();
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let child = command
            .arg(&ini)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not listen within 20 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -9` of PgBouncer: every client and server connection it held is cut.
    fn kill(&mut self) {
        // Under runuser the child is runuser; PgBouncer's own pid is in its pidfile.
        let pid = std::fs::read_to_string(self.dir.join("pgbouncer.pid")).unwrap_or_default();
        if !pid.trim().is_empty() {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.dir.join("pgbouncer.pid"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer still listens after kill -9"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The store's DSN through this PgBouncer.
    fn config(&self, server: &tokio_postgres::Config) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user(server.get_user().unwrap())
            .dbname(server.get_dbname().unwrap());
        config
    }

    /// Application names of the clients PgBouncer serves (its admin console).
    async fn client_applications(&self, server: &tokio_postgres::Config) -> Vec<String> {
        let mut admin = self.config(server);
        admin.dbname("pgbouncer");
        let (client, conn) = admin
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect to the admin console");
        tokio::spawn(conn);
        // The admin console speaks the simple query protocol only.
        let rows = client.simple_query("SHOW CLIENTS").await.unwrap();
        rows.iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    r.get("application_name").map(str::to_string)
                }
                _ => None,
            })
            .collect()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- pgbouncer.log (last lines) ---\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn count(store: &PgStore) -> usize {
    let list = store
        .list_raw::<AccessSession>(&ListQuery {
            namespace: Some(NS.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let items: Vec<bytes::Bytes> = list.items.try_collect().await.unwrap();
    items.len()
}

/// The next event: the one after `last`, an ADDED.
async fn next_event(sub: &mut Subscription, last: &mut u64) {
    let event = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("an event within 30 s")
        .expect("the watch goes on (no 410, no relist)");
    assert_eq!(event.seq(), *last + 1, "gap-free, in order");
    assert_eq!(event.event_type, EventType::Added);
    *last = event.seq();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_runs_behind_pgbouncer_in_session_mode_and_outlives_its_restart() {
    let db = TestDb::new().await;
    let mut bouncer = Bouncer::start(&db.config);
    let mut config = StoreConfig::new(bouncer.config(&db.config));
    config.staleness_bound = Duration::from_secs(2);
    config.pool_timeout = Duration::from_secs(2);
    config.session.lock_timeout = Duration::from_secs(1);
    let store = PgStore::start(config)
        .await
        .expect("the store starts through PgBouncer (no startup `options`)");

    // The change feed listens through PgBouncer, not around it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let apps = bouncer.client_applications(&db.config).await;
        if apps
            .iter()
            .any(|a| a == apiserver::store::FEED_APPLICATION_NAME)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the change feed is not a PgBouncer client: {apps:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let from = store.current_version().await.unwrap();
    let mut sub = store.subscribe(from).await.unwrap();
    let mut last = from.seq;
    for i in 0..20 {
        store
            .create_session(mk_session(NS, &format!("before-{i}"), "srv-1"), false)
            .await
            .unwrap();
    }
    for _ in 0..20 {
        next_event(&mut sub, &mut last).await;
    }
    assert_eq!(count(&store).await, 20);

    // The session limits hold through PgBouncer: a writer stuck behind another connection's
    // lock on the sync state gives up after the lock timeout (1 s), never hangs.
    let mut holder = db.client().await;
    let lock = holder.transaction().await.unwrap();
    lock.query_one("SELECT seq FROM sync_state WHERE id = 1 FOR UPDATE", &[])
        .await
        .unwrap();
    let stuck = tokio::time::timeout(
        Duration::from_secs(15),
        store.create_session(mk_session(NS, "stuck", "srv-1"), false),
    )
    .await
    .expect("a writer behind the lock is answered within 15 s: the lock timeout did not apply");
    assert!(stuck.is_err(), "written while the lock was held: {stuck:?}");
    lock.rollback().await.unwrap();

    // PgBouncer dies with every connection; while it is gone writes fail (never hang), and
    // once it is back the store and the watch go on by themselves.
    bouncer.kill();
    let failed = tokio::time::timeout(
        Duration::from_secs(30),
        store.create_session(mk_session(NS, "while-down", "srv-1"), false),
    )
    .await
    .expect("a write while the pooler is down is answered within 30 s");
    assert!(
        failed.is_err(),
        "a write succeeded with PgBouncer down: {failed:?}"
    );
    bouncer.run();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut written = 0;
    while written < 20 {
        match store
            .create_session(mk_session(NS, &format!("after-{written}"), "srv-1"), false)
            .await
        {
            Ok(_) => written += 1,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no write succeeded within 30 s of PgBouncer's restart: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for _ in 0..20 {
        next_event(&mut sub, &mut last).await;
    }
    assert_eq!(count(&store).await, 40);
}
