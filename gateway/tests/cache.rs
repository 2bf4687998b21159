//! The session cache against the real apiserver binary (standalone, real PostgreSQL): cold,
//! warm and stale; revocation, deletion and expiry through `authorize` and `subscribe`; 401s
//! and token rotation; an apiserver restart (new epoch) with changes made while it was down.

mod support;

use std::time::Duration;

use e2e::stopped::Stopped;
use gateway::{Decision, DenyReason};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use support::*;

const SERVER_UID: &str = "0b6f8c1e-1111-4a2b-9c3d-000000000001";
const HOUR: Duration = Duration::from_secs(3600);

fn deny(reason: DenyReason) -> Decision {
    Decision::Deny(reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denies_before_the_first_sync_then_serves_the_list() {
    // The cache starts before the apiserver: nothing to serve yet.
    let mut server = Apiserver::prepare(&[]).await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    let now = Timestamp::now();
    assert_eq!(
        cache.cache.authorize("team-a", "alice", now).await,
        deny(DenyReason::SyncNotReady)
    );
    assert!(!cache.cache.status().ready);
    assert_eq!(
        cache.metric("mcp_gateway_session_sync_age_seconds"),
        Some(-1.0)
    );

    server.launch().await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    cache.ready().await;
    eventually(Duration::from_secs(5), "alice is allowed", || async {
        cache
            .cache
            .authorize("team-a", "alice", Timestamp::now())
            .await
            == Decision::Allow
    })
    .await;
    let age = cache
        .metric("mcp_gateway_session_sync_age_seconds")
        .unwrap();
    assert!((0.0..5.0).contains(&age), "sync age {age}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_revoked_expired_and_not_found() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "active", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "revoked", SERVER_UID, HOUR)
        .await;
    server.revoke("team-a", "revoked").await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    cache.ready().await;
    let c = &cache.cache;
    let now = Timestamp::now();
    assert_eq!(c.authorize("team-a", "active", now).await, Decision::Allow);
    assert_eq!(
        c.authorize("team-a", "revoked", now).await,
        deny(DenyReason::SessionRevoked)
    );
    // Expiry is evaluated on every call with the time given: no decision is cached.
    let later = now + SignedDuration::from_hours(2);
    assert_eq!(
        c.authorize("team-a", "active", later).await,
        deny(DenyReason::SessionExpired)
    );
    assert_eq!(c.authorize("team-a", "active", now).await, Decision::Allow);
    assert_eq!(
        c.authorize("team-a", "nobody", now).await,
        deny(DenyReason::SessionNotFound)
    );
    assert_eq!(
        c.authorize("team-b", "active", now).await,
        deny(DenyReason::SessionNotFound),
        "the namespace is part of the name"
    );
    // Names no apiserver would accept are not sent to it (they go into the URL path).
    assert_eq!(
        c.authorize("team-a", "../../revocations", now).await,
        deny(DenyReason::SessionNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_issued_just_now_is_allowed_at_once() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "first", SERVER_UID, HOUR)
        .await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    cache.ready().await;
    // No wait between issuing and asking: the watch may not have delivered it yet, in which
    // case get-on-miss (same server UID as the snapshot) answers.
    for i in 0..5 {
        let name = format!("new-{i}");
        server
            .create_session("team-a", &name, SERVER_UID, HOUR)
            .await;
        assert_eq!(
            cache
                .cache
                .authorize("team-a", &name, Timestamp::now())
                .await,
            Decision::Allow,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_deletion_and_expiry_fire_subscriptions() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "to-revoke", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "to-delete", SERVER_UID, HOUR)
        .await;
    server
        .create_session("team-a", "short", SERVER_UID, Duration::from_secs(3))
        .await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    cache.ready().await;
    let c = &cache.cache;

    let revoked = tokio::spawn(c.subscribe("team-a", "to-revoke"));
    let deleted = tokio::spawn(c.subscribe("team-a", "to-delete"));
    let expired = tokio::spawn(c.subscribe("team-a", "short"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!revoked.is_finished() && !deleted.is_finished());
    assert_eq!(
        c.authorize("team-a", "to-revoke", Timestamp::now()).await,
        Decision::Allow
    );

    server.revoke("team-a", "to-revoke").await;
    let reason = tokio::time::timeout(Duration::from_secs(5), revoked)
        .await
        .expect("the subscription fires within 5 s of the revocation")
        .unwrap();
    assert_eq!(reason, DenyReason::SessionRevoked);
    assert_eq!(
        c.authorize("team-a", "to-revoke", Timestamp::now()).await,
        deny(DenyReason::SessionRevoked)
    );

    server.delete_session("team-a", "to-delete").await;
    let reason = tokio::time::timeout(Duration::from_secs(5), deleted)
        .await
        .expect("the subscription fires within 5 s of the deletion")
        .unwrap();
    assert_eq!(reason, DenyReason::SessionNotFound);

    // Nobody writes anything at expiry: the subscription's own timer fires.
    let reason = tokio::time::timeout(Duration::from_secs(10), expired)
        .await
        .expect("the subscription fires at expiry")
        .unwrap();
    assert_eq!(reason, DenyReason::SessionExpired);

    // Subscribing to a session that is already unusable resolves at once.
    let reason = tokio::time::timeout(Duration::from_secs(1), c.subscribe("team-a", "to-revoke"))
        .await
        .unwrap();
    assert_eq!(reason, DenyReason::SessionRevoked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_known_good_is_served_until_the_stale_window_passes() {
    let mut server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    // Bookmarks come every second; the margin keeps a loaded machine from going stale early.
    let window = Duration::from_secs(6);
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |c| c.stale_window = window);
    cache.ready().await;
    let c = &cache.cache;
    let sub = tokio::spawn(c.subscribe("team-a", "alice"));

    server.stop();
    let stopped = std::time::Instant::now();
    // Warm: the outage alone changes nothing within the window.
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        Decision::Allow
    );
    eventually(
        Duration::from_secs(10),
        "sync_stale after the window",
        || async {
            c.authorize("team-a", "alice", Timestamp::now()).await == deny(DenyReason::SyncStale)
        },
    )
    .await;
    assert!(
        // The window runs from the last proof (a bookmark), up to a second or two before
        // the stop on a loaded machine.
        stopped.elapsed() + Duration::from_secs(3) >= window,
        "stale only after about the window ({:?})",
        stopped.elapsed()
    );
    let reason = tokio::time::timeout(Duration::from_secs(2), sub)
        .await
        .expect("a stale cache ends subscriptions")
        .unwrap();
    assert_eq!(reason, DenyReason::SyncStale);
    assert!(!c.status().ready);
    let age = cache
        .metric("mcp_gateway_session_sync_age_seconds")
        .unwrap();
    assert!(age >= 2.0, "sync age {age} keeps growing while stale");

    // Back: the cache catches up and serves again.
    server.launch().await;
    cache.ready().await;
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        Decision::Allow
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_drops_authority_at_once() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    cache.ready().await;
    let c = &cache.cache;
    let sub = tokio::spawn(c.subscribe("team-a", "alice"));

    // The token is no longer accepted; the next request (here a get-on-miss) gets 401.
    cache.set_token("not-a-valid-token");
    assert_eq!(
        c.authorize("team-a", "unknown", Timestamp::now()).await,
        deny(DenyReason::SyncNotReady)
    );
    // At once, not after some window: the very next decision has no snapshot to use.
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        deny(DenyReason::SyncNotReady)
    );
    assert_eq!(c.status().sessions, 0, "the snapshot itself is gone");
    let reason = tokio::time::timeout(Duration::from_secs(2), sub)
        .await
        .expect("invalidation ends subscriptions")
        .unwrap();
    assert_eq!(reason, DenyReason::SyncNotReady);
    // The relist keeps failing with the bad token: nothing old comes back meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        deny(DenyReason::SyncNotReady)
    );
    assert!(
        cache
            .metric("mcp_gateway_session_invalidations_total")
            .unwrap()
            >= 1.0
    );

    // A rotated (valid) token on disk is used without a restart.
    cache.set_token(GATEWAY_TOKEN_ROTATED);
    cache.ready().await;
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        Decision::Allow
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_on_the_watch_drops_authority() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    // Short watches: the next one re-presents the token file's content.
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |c| {
        c.watch_timeout = Duration::from_secs(1)
    });
    cache.ready().await;
    cache.set_token("not-a-valid-token");
    eventually(
        Duration::from_secs(5),
        "the rewatch's 401 drops authority",
        || async {
            cache
                .cache
                .authorize("team-a", "alice", Timestamp::now())
                .await
                == deny(DenyReason::SyncNotReady)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_written_after_start_is_picked_up() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let cache = TestCache::start(&server, "placeholder-before-the-kubelet-writes", |_| {});
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        cache
            .cache
            .authorize("team-a", "alice", Timestamp::now())
            .await,
        deny(DenyReason::SyncNotReady)
    );
    cache.set_token(GATEWAY_TOKEN);
    cache.ready().await;
    assert_eq!(
        cache
            .cache
            .authorize("team-a", "alice", Timestamp::now())
            .await,
        Decision::Allow
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_rotation_relists_and_never_allows_what_was_revoked_meanwhile() {
    let mut server = Apiserver::start(&[]).await;
    for name in ["revoked-meanwhile", "deleted-meanwhile", "untouched"] {
        server
            .create_session("team-a", name, SERVER_UID, HOUR)
            .await;
    }
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |_| {});
    cache.ready().await;
    let c = &cache.cache;
    let old_epoch = epoch_of(&c.status().resource_version.unwrap());
    assert_eq!(
        c.authorize("team-a", "revoked-meanwhile", Timestamp::now())
            .await,
        Decision::Allow
    );

    // While the watched apiserver is down, another replica changes sessions.
    server.stop();
    server.start_peer().await;
    server.revoke("team-a", "revoked-meanwhile").await;
    server.delete_session("team-a", "deleted-meanwhile").await;
    server
        .create_session("team-a", "issued-meanwhile", SERVER_UID, HOUR)
        .await;

    // The restart rotates the epoch (as after a restore; an ordinary restart keeps it): the
    // cache's resourceVersion is refused (410), the snapshot is dropped and a relist
    // converges. From the moment the cache holds anything of the new epoch, the session
    // revoked meanwhile is never allowed.
    server.launch_with(&["--rotate-epoch"]).await;
    let mut saw_new_epoch = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let status = c.status();
        let decision = c
            .authorize("team-a", "revoked-meanwhile", Timestamp::now())
            .await;
        if let Some(rv) = status.resource_version.as_deref() {
            if epoch_of(rv) != old_epoch {
                saw_new_epoch = true;
                assert_ne!(decision, Decision::Allow, "allowed after the relist");
            }
        }
        if saw_new_epoch && status.ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        saw_new_epoch,
        "the cache relisted from the restarted apiserver"
    );
    let now = Timestamp::now();
    assert_eq!(
        c.authorize("team-a", "revoked-meanwhile", now).await,
        deny(DenyReason::SessionRevoked)
    );
    assert_eq!(
        c.authorize("team-a", "deleted-meanwhile", now).await,
        deny(DenyReason::SessionNotFound)
    );
    assert_eq!(
        c.authorize("team-a", "issued-meanwhile", now).await,
        Decision::Allow
    );
    assert_eq!(
        c.authorize("team-a", "untouched", now).await,
        Decision::Allow
    );
    assert!(
        cache
            .metric("mcp_gateway_session_invalidations_total")
            .unwrap()
            >= 1.0,
        "the epoch reset dropped the old snapshot instead of resuming it"
    );
    assert!(cache.metric("mcp_gateway_session_relists_total").unwrap() >= 2.0);
}

/// A 410 that is not an epoch change: while the watched apiserver is down, another replica
/// writes more than the log retains and trims it, so the cache's resourceVersion is gone when
/// it resumes. It missed an unknown number of changes, but its snapshot is a true past state:
/// it keeps answering from it (never `sync_not_ready`) for at most the lag bound while it
/// relists, and the relist brings what changed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_for_a_trimmed_log_keeps_the_snapshot_while_it_relists() {
    let mut server = Apiserver::start(&["--retained-events", "3"]).await;
    for name in ["revoked-meanwhile", "untouched"] {
        server
            .create_session("team-a", name, SERVER_UID, HOUR)
            .await;
    }
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |c| {
        c.max_lag = Duration::from_secs(5);
        c.retry_max = Duration::from_millis(200);
    });
    cache.ready().await;
    let c = &cache.cache;
    let old_epoch = epoch_of(&c.status().resource_version.unwrap());

    server.stop();
    server.start_peer().await;
    server.revoke("team-a", "revoked-meanwhile").await;
    for i in 0..10 {
        server
            .create_session("team-a", &format!("filler-{i}"), SERVER_UID, HOUR)
            .await;
    }
    // The peer trims the log to the last 3 changes (every 10 s).
    tokio::time::sleep(Duration::from_secs(11)).await;
    server.launch().await;

    // From the relaunch until the relist lands: the untouched session is answered from the
    // snapshot all along, never refused for want of one.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let decision = c.authorize("team-a", "untouched", Timestamp::now()).await;
        assert_eq!(decision, Decision::Allow, "the snapshot was dropped");
        if c.authorize("team-a", "revoked-meanwhile", Timestamp::now())
            .await
            == deny(DenyReason::SessionRevoked)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relist never brought the revocation"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        epoch_of(&c.status().resource_version.unwrap()),
        old_epoch,
        "no epoch change"
    );
    assert_eq!(
        cache.metric("mcp_gateway_session_missed_changes_total"),
        Some(1.0),
        "the 410 was taken for missed changes"
    );
    assert_eq!(
        cache.metric("mcp_gateway_session_invalidations_total"),
        Some(0.0),
        "nothing was dropped"
    );
}

/// The watch connection goes half-open (a middlebox lost the flow: nothing arrives, nothing is
/// closed). Bookmarks come every second, so within three intervals the cache drops that watch
/// and resumes on a new connection, where the revocation made meanwhile arrives. Without the
/// watchdog the cache would sit on the dead connection until its read timeout (over 5 min),
/// allowing the revoked session all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_watch_is_replaced_within_three_bookmark_intervals() {
    let server = Apiserver::start(&[]).await;
    server
        .create_session("team-a", "alice", SERVER_UID, HOUR)
        .await;
    let relay = Blackhole::start(server.port).await;
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |c| {
        c.sync_url = format!("https://{}", relay.addr)
    });
    cache.ready().await;
    let c = &cache.cache;
    // A first bookmark states the interval (1 s here): past the list's own proof, the age
    // falls back only through one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    eventually(Duration::from_secs(10), "a bookmark arrived", || async {
        cache.metric("mcp_gateway_session_sync_age_seconds") < Some(1.0)
    })
    .await;
    assert_eq!(
        cache.metric("mcp_gateway_session_quiet_watches_total"),
        Some(0.0)
    );

    relay.silence_open_connections();
    let silenced = std::time::Instant::now();
    server.revoke("team-a", "alice").await;
    eventually(
        Duration::from_secs(30),
        "the revocation reaches the cache over a new connection",
        || async {
            c.authorize("team-a", "alice", Timestamp::now()).await
                == deny(DenyReason::SessionRevoked)
        },
    )
    .await;
    let took = silenced.elapsed();
    eprintln!("half-open watch replaced; revocation applied {took:?} after the silence");
    assert!(
        cache.metric("mcp_gateway_session_quiet_watches_total") >= Some(1.0),
        "the watchdog fired"
    );
    // Expected: at most three 1 s intervals plus a reconnect (about 3 s); 5x that.
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

/// The apiserver's change-feed reader is stopped (SIGSTOP on its PostgreSQL backend) while the
/// heartbeat still reads the log's head: a revocation commits but is never delivered. The
/// bookmarks' head shows the cache it is behind, and after the lag bound it denies every
/// session (`sync_lagging`), not just the revoked one — long before the stale window. When the
/// reader reconnects, the same watch delivers the revocation (a stall ends no watch) and the
/// cache answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_behind_the_head_denies_after_the_lag_bound_and_recovers_on_the_same_watch() {
    // A wide staleness bound: the feed keeps vouching (and sending bookmarks with the head)
    // while its reader is stuck.
    let server = Apiserver::start(&["--change-feed-staleness-bound", "60s"]).await;
    for name in ["alice", "bob"] {
        server
            .create_session("team-a", name, SERVER_UID, HOUR)
            .await;
    }
    let max_lag = Duration::from_secs(1);
    let cache = TestCache::start(&server, GATEWAY_TOKEN, |c| c.max_lag = max_lag);
    cache.ready().await;
    let c = &cache.cache;
    eventually(Duration::from_secs(10), "a bookmark arrived", || async {
        cache.metric("mcp_gateway_session_sync_age_seconds") < Some(1.5)
    })
    .await;
    let backends = server.feed_backends().await;
    assert_eq!(backends.len(), 1, "one feed connection: {backends:?}");
    let stopped = Stopped::new(backends[0]);
    server.revoke("team-a", "alice").await;
    let revoked = std::time::Instant::now();
    eventually(
        Duration::from_secs(20),
        "the cache denies once behind for the lag bound",
        || async {
            c.authorize("team-a", "bob", Timestamp::now()).await == deny(DenyReason::SyncLagging)
        },
    )
    .await;
    let took = revoked.elapsed();
    eprintln!("behind the head: denying {took:?} after the revocation committed");
    assert_eq!(
        c.authorize("team-a", "alice", Timestamp::now()).await,
        deny(DenyReason::SyncLagging)
    );
    assert!(cache.metric("mcp_gateway_session_sync_lag_changes") >= Some(1.0));
    assert!(cache.metric("mcp_gateway_session_sync_lag_seconds") >= Some(1.0));
    // Expected: the heartbeat (1 s) + a bookmark (1 s) + the lag bound (1 s); 5x that.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let relists = cache.metric("mcp_gateway_session_relists_total");

    drop(stopped);
    eventually(
        Duration::from_secs(30),
        "the revocation arrives once the reader is back",
        || async {
            c.authorize("team-a", "alice", Timestamp::now()).await
                == deny(DenyReason::SessionRevoked)
        },
    )
    .await;
    eventually(Duration::from_secs(10), "bob is allowed again", || async {
        c.authorize("team-a", "bob", Timestamp::now()).await == Decision::Allow
    })
    .await;
    assert_eq!(
        cache.metric("mcp_gateway_session_sync_lag_seconds"),
        Some(0.0)
    );
    assert_eq!(
        cache.metric("mcp_gateway_session_relists_total"),
        relists,
        "caught up on the same watch, without a relist"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_or_missing_settings_refuse_to_start() {
    let server = Apiserver::prepare(&[]).await;
    let dir = scratch_dir();
    let token = dir.join("token");
    std::fs::write(&token, GATEWAY_TOKEN).unwrap();
    let start = |config: gateway::CacheConfig| gateway::SessionCache::start(config).err();

    let plain = gateway::CacheConfig::new(
        format!("http://127.0.0.1:{}", server.port),
        &server.ca_file,
        &token,
    );
    assert!(matches!(
        start(plain),
        Some(gateway::CacheError::InsecureUrl(_))
    ));
    let no_ca = gateway::CacheConfig::new(&server.url, dir.join("missing.crt"), &token);
    assert!(matches!(
        start(no_ca),
        Some(gateway::CacheError::CaFile { .. })
    ));
    std::fs::write(dir.join("empty.crt"), "not a certificate").unwrap();
    let empty_ca = gateway::CacheConfig::new(&server.url, dir.join("empty.crt"), &token);
    assert!(matches!(
        start(empty_ca),
        Some(gateway::CacheError::CaEmpty(_))
    ));
    let no_token = gateway::CacheConfig::new(&server.url, &server.ca_file, dir.join("missing"));
    assert!(matches!(
        start(no_token),
        Some(gateway::CacheError::TokenFile { .. })
    ));
    std::fs::write(dir.join("blank"), "  \n").unwrap();
    let blank = gateway::CacheConfig::new(&server.url, &server.ca_file, dir.join("blank"));
    assert!(matches!(
        start(blank),
        Some(gateway::CacheError::TokenEmpty(_))
    ));
    let mut long = gateway::CacheConfig::new(&server.url, &server.ca_file, &token);
    long.stale_window = Duration::from_secs(3600);
    assert!(matches!(
        start(long),
        Some(gateway::CacheError::StaleWindow(_))
    ));
    let _ = std::fs::remove_dir_all(dir);
}
