//! Attacks on the HTTP layer (issue 8): patch bombs, deep bodies, oversized objects, label
//! explosion in metrics, slow and stuck clients, floods over the in-flight and watch caps,
//! and the smaller refusals (cluster-wide deletecollection, selector sizes, secret file
//! permissions, a loopback-only metrics listener). Each test sends the real attack to a real
//! server and then checks the server still answers.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::http::{HttpConfig, Limits};
use serde_json::{json, Value};
use support::cause_fields;
use support::server::{TestServer, ADMIN_TOKEN, USER_TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn ns_url(server: &TestServer, ns: &str, plural: &str) -> String {
    format!(
        "{}/apis/{}/namespaces/{ns}/{plural}",
        server.url,
        apis::API_VERSION
    )
}

fn expires() -> String {
    let t = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_hours(1);
    k8s_openapi::jiff::Timestamp::from_second(t.as_second())
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn session_json(name: &str) -> Value {
    json!({
        "apiVersion": apis::API_VERSION,
        "kind": "AccessSession",
        "metadata": {"name": name},
        "spec": {
            "server": {"name": "github", "uid": "srv-1"},
            "subject": {"user": "alice@example.com"},
            "expiresAt": expires(),
        }
    })
}

async fn create_session(server: &TestServer, ns: &str, name: &str) -> Value {
    let resp = server
        .http()
        .post(ns_url(server, ns, "accesssessions"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&session_json(name))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    body
}

/// Sends a request and returns the code and the Status (or object) it answered.
async fn send(req: reqwest::RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = req.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body, headers)
}

/// A JSON patch of `url` whose every copy doubles the annotations: 2^40 KiB if nothing
/// stops it.
async fn copy_bomb(server: &TestServer, url: &str) -> (u16, Value) {
    let mut ops = vec![
        json!({"op": "add", "path": "/metadata/annotations", "value": {"a": "x".repeat(1024)}}),
    ];
    for i in 0..40 {
        ops.push(json!({"op": "copy", "from": "/metadata/annotations", "path": format!("/metadata/annotations/c{i}")}));
    }
    patch(
        server,
        url,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
    )
    .await
}

async fn patch(server: &TestServer, url: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
    let (code, body, _) = send(
        server
            .http()
            .patch(url)
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", content_type)
            .body(body),
    )
    .await;
    (code, body)
}

/// The server still serves a read after an attack.
async fn assert_alive(server: &TestServer, ns: &str, name: &str) {
    let (code, body, _) = send(
        server
            .http()
            .get(format!("{}/{name}", ns_url(server, ns, "accesssessions")))
            .bearer_auth(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200, "the server must still answer: {body}");
}

// ---------------------------------------------------------------------------------------
// Item 3: JSON-patch bombs, deep bodies, merge and strategic patches, the status path.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patch_move_chain_is_refused_not_a_crash() {
    let server = TestServer::start().await;
    create_session(&server, "bomb", "s1").await;
    let url = format!("{}/s1", ns_url(&server, "bomb", "accesssessions"));
    // Each round nests /spec/a one level deeper: 3,000 levels with 9,001 operations, the
    // stack overflow of the original report.
    let mut ops = vec![json!({"op": "add", "path": "/spec/a", "value": {}})];
    for _ in 0..3000 {
        ops.push(json!({"op": "add", "path": "/spec/b", "value": {}}));
        ops.push(json!({"op": "move", "from": "/spec/a", "path": "/spec/b/a"}));
        ops.push(json!({"op": "move", "from": "/spec/b", "path": "/spec/a"}));
    }
    let (code, body) = patch(
        &server,
        &url,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["reason"], "Invalid", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("nested more than"),
        "{body}"
    );
    assert_alive(&server, "bomb", "s1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patch_copy_bomb_is_refused() {
    let server = TestServer::start().await;
    create_session(&server, "bomb", "s1").await;
    let url = format!("{}/s1", ns_url(&server, "bomb", "accesssessions"));
    let (code, body) = copy_bomb(&server, &url).await;
    assert_eq!(code, 422, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("unable to copy"),
        "{body}"
    );
    assert_alive(&server, "bomb", "s1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_patch_over_ten_thousand_operations_is_413() {
    let server = TestServer::start().await;
    create_session(&server, "bomb", "s1").await;
    let url = format!("{}/s1", ns_url(&server, "bomb", "accesssessions"));
    let ops: Vec<Value> = (0..10_001)
        .map(|_| json!({"op": "test", "path": "/kind", "value": "AccessSession"}))
        .collect();
    let (code, body) = patch(
        &server,
        &url,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
    )
    .await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge", "{body}");
    // Exactly at the limit is served.
    let ops: Vec<Value> = (0..10_000)
        .map(|_| json!({"op": "test", "path": "/kind", "value": "AccessSession"}))
        .collect();
    let (code, body) = patch(
        &server,
        &url,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

fn nested(depth: usize) -> String {
    format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_bodies_are_refused_for_every_write() {
    let server = TestServer::start().await;
    create_session(&server, "deep", "s1").await;
    let collection = ns_url(&server, "deep", "accesssessions");
    let url = format!("{collection}/s1");
    let deep_spec = |depth: usize| {
        format!(
            r#"{{"apiVersion":"{}","kind":"AccessSession","metadata":{{"name":"s2"}},"spec":{{"x":{}}}}}"#,
            apis::API_VERSION,
            nested(depth)
        )
    };
    // Create and update with 100,000 levels of nesting.
    for (method, target) in [
        (reqwest::Method::POST, &collection),
        (reqwest::Method::PUT, &url),
    ] {
        let (code, body, _) = send(
            server
                .http()
                .request(method.clone(), target.as_str())
                .bearer_auth(ADMIN_TOKEN)
                .header("Content-Type", "application/json")
                .body(deep_spec(100_000)),
        )
        .await;
        assert_eq!(code, 400, "{method}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("nested"),
            "{body}"
        );
    }
    // Merge and strategic merge patches.
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
    ] {
        let body = format!(r#"{{"spec":{{"x":{}}}}}"#, nested(100_000));
        let (code, status) = patch(&server, &url, ct, body.into_bytes()).await;
        assert_eq!(code, 400, "{ct}: {status}");
    }
    // Deep but within serde's own limit (128) and above ours: still refused, cleanly.
    let body = format!(r#"{{"spec":{{"x":{}}}}}"#, nested(110));
    let (code, status) = patch(
        &server,
        &url,
        "application/merge-patch+json",
        body.into_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    // A modest unknown nesting is still accepted (and dropped, with a warning).
    let body = format!(r#"{{"spec":{{"x":{}}}}}"#, nested(20));
    let (code, status) = patch(
        &server,
        &url,
        "application/merge-patch+json",
        body.into_bytes(),
    )
    .await;
    assert_eq!(code, 200, "{status}");
    assert_alive(&server, "deep", "s1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_patch_bombs_are_refused() {
    let server = TestServer::start().await;
    let enrollment = json!({
        "apiVersion": apis::API_VERSION,
        "kind": "Enrollment",
        "metadata": {"name": "e1"},
        "spec": {
            "server": {"name": "github", "uid": "srv-1"},
            "subject": {"user": "alice@example.com"},
            "expiresAt": expires(),
        }
    });
    let (code, body, _) = send(
        server
            .http()
            .post(ns_url(&server, "st", "enrollments"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&enrollment),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let url = format!("{}/e1/status", ns_url(&server, "st", "enrollments"));
    let (code, body) = copy_bomb(&server, &url).await;
    assert_eq!(code, 422, "{body}");
    let mut ops = vec![json!({"op": "add", "path": "/status/a", "value": {}})];
    for _ in 0..3000 {
        ops.push(json!({"op": "add", "path": "/status/b", "value": {}}));
        ops.push(json!({"op": "move", "from": "/status/a", "path": "/status/b/a"}));
        ops.push(json!({"op": "move", "from": "/status/b", "path": "/status/a"}));
    }
    let (code, body) = patch(
        &server,
        &url,
        "application/json-patch+json",
        serde_json::to_vec(&ops).unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    let (code, body, _) = send(
        server
            .http()
            .get(format!("{}/e1", ns_url(&server, "st", "enrollments")))
            .bearer_auth(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

// ---------------------------------------------------------------------------------------
// Item 4: object size, finalizers and owner references.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_objects_are_413_and_metadata_is_validated() {
    let server = TestServer::start().await;
    create_session(&server, "big", "s1").await;
    let url = format!("{}/s1", ns_url(&server, "big", "accesssessions"));
    let current = |finalizers: Vec<String>| {
        let mut s = session_json("s1");
        s["metadata"]["finalizers"] = json!(finalizers);
        s
    };
    // 2.9 MB of valid finalizers: under the body limit, over the object limit.
    let many: Vec<String> = (0..88_000)
        .map(|i| format!("example.com/finalizer-{i:08}"))
        .collect();
    let body = serde_json::to_vec(&current(many.clone())).unwrap();
    assert!(body.len() > 2_500_000 && body.len() < 3 * 1024 * 1024);
    let (code, status, _) = send(
        server
            .http()
            .put(&url)
            .bearer_auth(ADMIN_TOKEN)
            .header("Content-Type", "application/json")
            .body(body.clone()),
    )
    .await;
    assert_eq!(code, 413, "{status}");
    assert_eq!(status["reason"], "RequestEntityTooLarge", "{status}");
    // The same through create and a merge patch.
    let mut fresh = current(many.clone());
    fresh["metadata"]["name"] = json!("s2");
    let (code, status, _) = send(
        server
            .http()
            .post(ns_url(&server, "big", "accesssessions"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&fresh),
    )
    .await;
    assert_eq!(code, 413, "{status}");
    let (code, status) = patch(
        &server,
        &url,
        "application/merge-patch+json",
        serde_json::to_vec(&json!({"metadata": {"finalizers": many}})).unwrap(),
    )
    .await;
    assert_eq!(code, 413, "{status}");

    // Finalizers and owner references as kube-apiserver validates them.
    for (patch_body, field) in [
        (
            json!({"metadata": {"finalizers": ["cleanup"]}}),
            "metadata.finalizers[0]",
        ),
        (
            json!({"metadata": {"finalizers": ["Bad Name/x"]}}),
            "metadata.finalizers[0]",
        ),
        (
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "", "uid": "u1"}]}}),
            "metadata.ownerReferences[0].name",
        ),
        (
            json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "a", "uid": "u1", "controller": true},
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "b", "uid": "u2", "controller": true}
            ]}}),
            "metadata.ownerReferences",
        ),
    ] {
        let (code, status) = patch(
            &server,
            &url,
            "application/merge-patch+json",
            serde_json::to_vec(&patch_body).unwrap(),
        )
        .await;
        assert_eq!(code, 422, "{patch_body}: {status}");
        let fields = cause_fields(&status);
        assert!(fields.contains(&field), "{field} in {status}");
    }
    let (code, status) = patch(
        &server,
        &url,
        "application/merge-patch+json",
        serde_json::to_vec(&json!({"metadata": {
            "finalizers": ["example.com/cleanup", "kubernetes"],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "a", "uid": "u1", "controller": true}]
        }}))
        .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{status}");
}

/// Values PostgreSQL cannot store are refused before anything is decoded or stored, with a
/// clear 4xx, for every write: a NUL character in any string (jsonb refuses it) and a server
/// UID too long for its index. Neither is a 500, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_the_database_cannot_hold_are_refused_up_front() {
    let server = TestServer::start().await;
    create_session(&server, "nul", "s1").await;
    let url = format!("{}/s1", ns_url(&server, "nul", "accesssessions"));
    let mut nul_annotation = session_json("s2");
    nul_annotation["metadata"]["annotations"] = json!({"note": "a\u{0}b"});
    let mut nul_key = session_json("s3");
    nul_key["metadata"]["labels"] = json!({"a\u{0}": "b"});
    for body in [nul_annotation, nul_key] {
        let (code, status, _) = send(
            server
                .http()
                .post(ns_url(&server, "nul", "accesssessions"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body),
        )
        .await;
        assert_eq!(code, 400, "{status}");
        assert_eq!(status["reason"], "BadRequest", "{status}");
        assert!(
            status["message"].as_str().unwrap().contains("NUL"),
            "{status}"
        );
    }
    for (content_type, body) in [
        (
            "application/merge-patch+json",
            json!({"metadata": {"annotations": {"note": "\u{0}"}}}),
        ),
        (
            "application/json-patch+json",
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"n": "\u{0}"}}]),
        ),
    ] {
        let (code, status) = patch(
            &server,
            &url,
            content_type,
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert_eq!(code, 400, "{content_type}: {status}");
    }
    // A backslash followed by the text "u0000" is an ordinary string.
    let (code, status) = patch(
        &server,
        &url,
        "application/merge-patch+json",
        serde_json::to_vec(&json!({"metadata": {"annotations": {"note": "\\u0000"}}})).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["metadata"]["annotations"]["note"], "\\u0000");

    // A server UID too long for its index: 422 on the field, for sessions and revocations.
    let mut long_uid = session_json("s4");
    long_uid["spec"]["server"]["uid"] = json!("u".repeat(129));
    let revocation = json!({
        "apiVersion": apis::API_VERSION,
        "kind": "Revocation",
        "metadata": {"name": "r1"},
        "spec": {"target": {"server": {"name": "github", "uid": "u".repeat(5000)}}, "cause": "manual"},
    });
    for (plural, body, field) in [
        ("accesssessions", long_uid, "spec.server.uid"),
        ("revocations", revocation, "spec.target.server.uid"),
    ] {
        let (code, status, _) = send(
            server
                .http()
                .post(ns_url(&server, "nul", plural))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body),
        )
        .await;
        assert_eq!(code, 422, "{plural}: {status}");
        assert!(cause_fields(&status).contains(&field), "{status}");
    }
    let mut longest = session_json("s5");
    longest["spec"]["server"]["uid"] = json!("u".repeat(128));
    let (code, status, _) = send(
        server
            .http()
            .post(ns_url(&server, "nul", "accesssessions"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&longest),
    )
    .await;
    assert_eq!(code, 201, "{status}");
    assert_alive(&server, "nul", "s1").await;
}

// ---------------------------------------------------------------------------------------
// Item 5: no metrics label from untrusted input.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_labels_stay_bounded_under_random_methods_and_paths() {
    let server = TestServer::start().await;
    let client = server.http();
    let mut sent = Vec::new();
    for i in 0..300 {
        let word = format!("ZQ{}X{i}", uuid::Uuid::new_v4().simple());
        let method = reqwest::Method::from_bytes(word.to_uppercase().as_bytes()).unwrap();
        let paths = [
            format!("/{word}"),
            format!("/apis/{}/{word}", apis::API_VERSION),
            format!("/apis/{}/namespaces/x/{word}/y", apis::API_VERSION),
        ];
        let path = &paths[i % paths.len()];
        // Unauthenticated, then authenticated, with a random method each time.
        let token = if i % 2 == 0 { None } else { Some(ADMIN_TOKEN) };
        let mut req = client.request(method.clone(), format!("{}{path}", server.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        assert!(resp.status().as_u16() >= 400);
        let mut req = client.get(format!("{}{path}", server.url));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.unwrap();
        sent.push(word);
    }
    let text = server.metrics_text();
    assert!(
        text.len() < 16 * 1024,
        "/metrics grew to {} bytes:\n{text}",
        text.len()
    );
    let lower = text.to_lowercase();
    for word in &sent {
        assert!(
            !lower.contains(&word.to_lowercase()),
            "{word} leaked into /metrics:\n{text}"
        );
    }
    assert!(text.contains("verb=\"other\""), "{text}");
}

// ---------------------------------------------------------------------------------------
// Item 6: slow clients, idle connections, floods.

fn tls_connector(server: &TestServer) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(server.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

use rustls_pki_types::pem::PemObject;

async fn raw_tls(server: &TestServer) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let addr: std::net::SocketAddr = server.url.trim_start_matches("https://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive buffer: a client that stops reading fills it (and the server's
    // send buffer) quickly.
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let tcp = socket.connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tls_connector(server).connect(name, tcp).await.unwrap()
}

/// Reads until the server closes the connection; returns what was read and how long it took.
async fn read_to_close(
    stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    bound: Duration,
) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(bound.saturating_sub(start.elapsed()), stream.read(&mut buf))
            .await
        {
            Err(_) => panic!(
                "the server kept the connection open for {bound:?} ({} bytes read)",
                out.len()
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, start.elapsed()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn quick_limits() -> Limits {
    Limits {
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        write_stall_timeout: Duration::from_secs(2),
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_idle_connections_are_closed() {
    let server = TestServer::start_limited(|_| {}, HttpConfig::default(), quick_limits()).await;
    // Headers started and never finished, one byte every half second.
    let slow = raw_tls(&server).await;
    let (mut reader, mut writer) = tokio::io::split(slow);
    writer
        .write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if writer.write_all(b"X").await.is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(6), reader.read(&mut buf)).await {
            Err(_) => panic!("a client trickling its headers kept the connection for 6s"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
        }
    }
    // Expected 1 s (header_read_timeout); 6 s is 6x.
    assert!(start.elapsed() < Duration::from_secs(6));
    trickle.abort();

    // A connection that says nothing at all after the handshake.
    let mut silent = raw_tls(&server).await;
    let (_, took) = read_to_close(&mut silent, Duration::from_secs(10)).await;
    // Expected 1 s (header_read_timeout); 10 s is 10x.
    assert!(took < Duration::from_secs(10));

    // A keep-alive connection left idle after one request.
    let mut idle = raw_tls(&server).await;
    idle.write_all(
        format!("GET /version HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (read, took) = read_to_close(&mut idle, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&read).starts_with("HTTP/1.1 200"));
    // Not before the idle timeout (1 s), within the granularity of the two clocks: the server
    // counts idleness in whole milliseconds (`ConnState`), and a CI run measured 999.4 ms here.
    assert!(took >= Duration::from_millis(950), "closed after {took:?}");

    // The server still answers.
    let (code, _, _) = send(
        server
            .http()
            .get(format!("{}/version", server.url))
            .bearer_auth(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_inflight_cap_get_429_with_retry_after() {
    let limits = Limits {
        max_requests_inflight: 3,
        ..Limits::default()
    };
    let server = TestServer::start_limited(|_| {}, HttpConfig::default(), limits).await;
    let url = ns_url(&server, "flood", "accesssessions");
    let path = url.trim_start_matches(&server.url).to_string();
    // Three reads held in flight: headers sent, the body promised and never sent. (Writes
    // have a pool of their own: attacks_slow.rs.)
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = raw_tls(&server).await;
        conn.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        held.push(conn);
    }
    // The flood: every further request is refused at once, authenticated or not.
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while refused < 20 && Instant::now() < deadline {
        let (code, status, headers) = send(
            server
                .http()
                .get(format!("{}/version", server.url))
                .bearer_auth(ADMIN_TOKEN),
        )
        .await;
        if code == 200 {
            // The held requests may not all have reached the server yet.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(code, 429, "{status}");
        assert_eq!(status["reason"], "TooManyRequests", "{status}");
        assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
        assert_eq!(headers.get("retry-after").unwrap(), "1");
        refused += 1;
    }
    assert_eq!(refused, 20, "the flood was not refused");
    let text = server.metrics_text();
    assert!(text.contains("code=\"429\""), "{text}");
    // The gauge shows the pool full: the three held reads, no write.
    assert!(
        text.contains(
            "mcp_access_apiserver_current_inflight_requests{request_kind=\"readOnly\"} 3"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "mcp_access_apiserver_current_inflight_requests{request_kind=\"mutating\"} 0"
        ),
        "{text}"
    );
    // Watches are not counted against the cap.
    let resp = server
        .http()
        .get(format!("{url}?watch=1&timeoutSeconds=1"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    // Once the held requests go away, requests are served again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (code, _, _) = send(
            server
                .http()
                .get(format!("{}/version", server.url))
                .bearer_auth(ADMIN_TOKEN),
        )
        .await;
        if code == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the flood ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every place is given back once the server saw the held connections go.
    let idle = "mcp_access_apiserver_current_inflight_requests{request_kind=\"readOnly\"} 0";
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.metrics_text().contains(idle) {
        assert!(Instant::now() < deadline, "{}", server.metrics_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_per_user_are_capped_and_released() {
    let limits = Limits {
        max_watches_per_user: 2,
        ..Limits::default()
    };
    let server = TestServer::start_limited(|_| {}, HttpConfig::default(), limits).await;
    let url = format!("{}?watch=1", ns_url(&server, "w", "accesssessions"));
    let watch = |token: &'static str| server.http().get(&url).bearer_auth(token).send();
    let first = watch(USER_TOKEN).await.unwrap();
    let second = watch(USER_TOKEN).await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = watch(USER_TOKEN).await.unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers().get("retry-after").unwrap(), "1");
    let status: Value = third.json().await.unwrap();
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
    // Another user is not affected.
    let admin = watch(ADMIN_TOKEN).await.unwrap();
    assert_eq!(admin.status(), 200);
    // Ending a watch frees its slot.
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        let resp = watch(USER_TOKEN).await.unwrap();
        if resp.status() == 200 {
            break resp;
        }
        assert!(Instant::now() < deadline, "the slot was never released");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop((second, again, admin));
}

/// `mcp_access_apiserver_open_watches` as /metrics shows it.
fn open_watches(server: &TestServer) -> i64 {
    server
        .metrics_text()
        .lines()
        .find_map(|l| l.strip_prefix("mcp_access_apiserver_open_watches "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

async fn wait_for_watches(server: &TestServer, n: i64, bound: Duration) {
    let deadline = Instant::now() + bound;
    while open_watches(server) != n {
        assert!(
            Instant::now() < deadline,
            "{} open watches after {bound:?}, expected {n}",
            open_watches(server)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes ~60 MB of events (more than the watch's line queue of 256 lines of 150 KiB and
/// both sockets' buffers hold, ~43 MB here), then opens a watch replaying them from before
/// the first on a raw connection that never reads: once the replay has filled everything,
/// the watch task is blocked on a full queue.
async fn stuck_watch(
    server: &TestServer,
    ns: &str,
    timeout: u64,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let created = create_session(server, ns, "s1").await;
    let from = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!("{}/s1", ns_url(server, ns, "accesssessions"));
    let big = "x".repeat(150 * 1024);
    for i in 0..400 {
        let (code, body) = patch(
            server,
            &url,
            "application/merge-patch+json",
            serde_json::to_vec(&json!({"metadata": {"annotations": {"big": format!("{i}{big}")}}}))
                .unwrap(),
        )
        .await;
        assert_eq!(code, 200, "{body}");
    }
    let path = format!(
        "/apis/{}/namespaces/{ns}/accesssessions?watch=1&resourceVersion={from}&timeoutSeconds={timeout}",
        apis::API_VERSION
    );
    let mut conn = raw_tls(server).await;
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    wait_for_watches(server, 1, Duration::from_secs(5)).await;
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_still_meets_its_deadline() {
    let limits = Limits {
        // Only the watch's own deadline can end it here.
        write_stall_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        ..Limits::default()
    };
    let server = TestServer::start_limited(|_| {}, HttpConfig::default(), limits).await;
    // The deadline leaves the replay time to fill the queue and block the task.
    let _conn = stuck_watch(&server, "stuck", 20).await;
    let started = Instant::now();
    wait_for_watches(&server, 0, Duration::from_secs(20 + 5)).await;
    eprintln!(
        "the stuck watch ended {:?} after it started",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_client_stops_reading_is_dropped() {
    let limits = Limits {
        write_stall_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(600),
        ..Limits::default()
    };
    let server = TestServer::start_limited(|_| {}, HttpConfig::default(), limits).await;
    let mut conn = stuck_watch(&server, "stalled", 3600).await;
    // Dropping the connection ends its watch long before the watch's own deadline.
    wait_for_watches(&server, 0, Duration::from_secs(2 + 5)).await;
    // The stream was cut short (no final chunk), then closed.
    let (read, _) = read_to_close(&mut conn, Duration::from_secs(30)).await;
    assert!(String::from_utf8_lossy(&read[..12]).starts_with("HTTP/1.1 200"));
    assert!(
        !read.ends_with(b"0\r\n\r\n"),
        "the response was completed, so the connection was not dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_stops_reading_does_not_hold_up_shutdown() {
    let server = TestServer::start().await;
    let _conn = stuck_watch(&server, "stuck2", 3600).await;
    // Time for the replay to fill the queue and block the task; still open.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(open_watches(&server), 1);
    server.shutdown();
    // Sooner than the connection's drain bound (5 s), after which it would be dropped.
    wait_for_watches(&server, 0, Duration::from_secs(3)).await;
}

// ---------------------------------------------------------------------------------------
// Item 12: cluster-wide deletecollection, selector sizes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_deletecollection_is_405_and_selectors_are_bounded() {
    let server = TestServer::start().await;
    create_session(&server, "keep", "s1").await;
    let all = format!("{}/apis/{}/accesssessions", server.url, apis::API_VERSION);
    let (code, status, _) = send(server.http().delete(&all).bearer_auth(ADMIN_TOKEN)).await;
    assert_eq!(code, 405, "{status}");
    assert_eq!(status["reason"], "MethodNotAllowed", "{status}");
    assert_alive(&server, "keep", "s1").await;
    // The namespaced collection still deletes.
    let (code, status, _) = send(
        server
            .http()
            .delete(ns_url(&server, "keep", "accesssessions"))
            .bearer_auth(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200, "{status}");

    let list = |query: String| {
        server
            .http()
            .get(format!("{all}?{query}"))
            .bearer_auth(ADMIN_TOKEN)
    };
    let labels: Vec<String> = (0..101).map(|i| format!("k{i}%3Dv")).collect();
    let (code, status, _) = send(list(format!("labelSelector={}", labels.join("%2C")))).await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("more than 100"),
        "{status}"
    );
    let values: Vec<String> = (0..257).map(|i| format!("v{i}")).collect();
    let (code, status, _) = send(list(format!(
        "labelSelector=k+in+%28{}%29",
        values.join("%2C")
    )))
    .await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("at most 256"),
        "{status}"
    );
    let fields = vec!["metadata.name!%3Dx"; 33].join("%2C");
    let (code, status, _) = send(list(format!("fieldSelector={fields}"))).await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("more than 32"),
        "{status}"
    );
    let fields = vec!["metadata.name!%3Dx"; 32].join("%2C");
    let (code, status, _) = send(list(format!("fieldSelector={fields}"))).await;
    assert_eq!(code, 200, "{status}");
}

// ---------------------------------------------------------------------------------------
// The real binary (`MCP_ACCESS_APISERVER_BIN`, standalone mode as `hack/dev.sh` runs it):
// memory under oversized writes, descriptor exhaustion, startup checks, listener addresses.

/// A standalone `mcp-access-apiserver` process over a database of its own.
struct Binary {
    child: std::process::Child,
    port: u16,
    metrics_port: u16,
    dir: std::path::PathBuf,
    ca_pem: String,
    token: String,
    _db: support::TestDb,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn apiserver_bin() -> String {
    std::env::var("MCP_ACCESS_APISERVER_BIN").expect(
        "MCP_ACCESS_APISERVER_BIN is not set: run through hack/test.sh, which builds the binary",
    )
}

fn private_file(path: &std::path::Path, contents: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn scratch_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mcp-access-attack-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("apiserver.log")).unwrap_or_default()
}

impl Binary {
    /// Starts the binary; `max_fds` runs it under `ulimit -n`.
    async fn start(extra: &[&str], max_fds: Option<u32>) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let db = support::TestDb::new().await;
        let dsn = db.dsn().to_string();
        let dir = scratch_dir();
        let token = format!("t-{}", uuid::Uuid::new_v4().simple());
        private_file(
            &dir.join("tokens.csv"),
            &format!("{token},admin,admin-uid,\"system:masters\"\n"),
            0o600,
        );
        // Port 0: the process binds once and says which ports it got (see below).
        let mut args: Vec<String> = vec![
            "--standalone".into(),
            "--token-auth-file".into(),
            dir.join("tokens.csv").display().to_string(),
            "--cert-dir".into(),
            dir.display().to_string(),
            "--secure-port".into(),
            "0".into(),
            "--metrics-port".into(),
            "0".into(),
            "--database-pool-size".into(),
            "4".into(),
        ];
        if !extra.contains(&"--bind-address") {
            args.extend(["--bind-address".into(), "127.0.0.1".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut cmd = match max_fds {
            Some(n) => {
                let mut c = std::process::Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(apiserver_bin());
                c
            }
            None => std::process::Command::new(apiserver_bin()),
        };
        let log = std::fs::File::create(dir.join("apiserver.log")).unwrap();
        let mut child = cmd
            .args(&args)
            .env("MCP_ACCESS_DATABASE_URL", &dsn)
            .env("RUST_LOG", "warn")
            .stdout(log.try_clone().unwrap())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut listening = e2e::listening::follow("mcp-access-apiserver", stderr, log);
        let ports = listening
            .wait_ports(&["api", "metrics"], e2e::listening::LISTEN_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}: {}", read_log(&dir)));
        let (port, metrics_port) = (ports[0], ports[1]);
        let mut bin = Self {
            child,
            port,
            metrics_port,
            dir,
            ca_pem: String::new(),
            token,
            _db: db,
        };
        let ready = format!("http://127.0.0.1:{metrics_port}/readyz");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = bin.child.try_wait() {
                panic!("the apiserver exited ({status}): {}", bin.log());
            }
            if let Ok(resp) = reqwest::get(&ready).await {
                if resp.status() == 200 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "not ready: {}", bin.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bin.ca_pem = std::fs::read_to_string(bin.dir.join("apiserver.crt")).unwrap();
        bin
    }

    fn log(&self) -> String {
        read_log(&self.dir)
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()])
            .build()
            .unwrap()
    }

    /// VmRSS of the process, in KiB.
    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    async fn version(&self) -> u16 {
        match self
            .http()
            .get(format!("{}/version", self.url()))
            .bearer_auth(&self.token)
            .send()
            .await
        {
            Ok(resp) => resp.status().as_u16(),
            Err(_) => 0,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_oversized_puts_are_refused_and_memory_stays_bounded() {
    let bin = Binary::start(&[], None).await;
    let collection = format!(
        "{}/apis/{}/namespaces/mem/accesssessions",
        bin.url(),
        apis::API_VERSION
    );
    let client = bin.http();
    let resp = client
        .post(&collection)
        .bearer_auth(&bin.token)
        .json(&session_json("s1"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let mut session = session_json("s1");
    session["metadata"]["finalizers"] = json!((0..88_000)
        .map(|i| format!("example.com/finalizer-{i:08}"))
        .collect::<Vec<_>>());
    let body = serde_json::to_vec(&session).unwrap();
    assert!(
        body.len() > 2_800_000 && body.len() < 3 * 1024 * 1024,
        "{}",
        body.len()
    );
    let before = bin.rss_kib();
    for _ in 0..40 {
        let resp = client
            .put(format!("{collection}/s1"))
            .bearer_auth(&bin.token)
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 413);
    }
    let after = bin.rss_kib();
    eprintln!(
        "VmRSS before the 40 PUTs of {} bytes: {before} KiB, after: {after} KiB",
        body.len()
    );
    // Before the cap every PUT was stored, fed to the change feed and kept: 1.39 GB.
    assert!(
        after < before + 200 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert_eq!(bin.version().await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_does_not_end_the_process() {
    let mut bin = Binary::start(&[], Some(96)).await;
    // Far more connections than the process may hold descriptors for.
    let mut conns = Vec::new();
    for _ in 0..200 {
        if let Ok(c) = tokio::net::TcpStream::connect(("127.0.0.1", bin.port)).await {
            conns.push(c);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        bin.child.try_wait().unwrap().is_none(),
        "the apiserver exited: {}",
        bin.log()
    );
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while bin.version().await != 200 {
        assert!(
            bin.child.try_wait().unwrap().is_none(),
            "the apiserver exited: {}",
            bin.log()
        );
        assert!(
            Instant::now() < deadline,
            "not serving again: {}",
            bin.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        bin.log().contains("cannot accept a connection"),
        "{}",
        bin.log()
    );
}

/// Runs the binary expecting it to refuse to start; returns its output.
fn refused_start(args: &[&str]) -> String {
    let out = std::process::Command::new(apiserver_bin())
        .args(args)
        .env(
            "MCP_ACCESS_DATABASE_URL",
            "host=127.0.0.1 port=1 user=nobody",
        )
        .output()
        .unwrap();
    assert!(!out.status.success(), "the apiserver started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn world_readable_token_and_key_files_are_refused_at_startup() {
    let dir = scratch_dir();
    let tokens = dir.join("tokens.csv");
    private_file(&tokens, "tok,admin,admin-uid,\"system:masters\"\n", 0o644);
    let tokens_arg = tokens.display().to_string();
    let err = refused_start(&["--standalone", "--token-auth-file", &tokens_arg]);
    assert!(err.contains("readable by group or others"), "{err}");
    private_file(&tokens, "tok,admin,admin-uid,\"system:masters\"\n", 0o640);
    let err = refused_start(&["--standalone", "--token-auth-file", &tokens_arg]);
    assert!(err.contains("readable by group or others"), "{err}");

    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    private_file(&key, &generated.signing_key.serialize_pem(), 0o644);
    private_file(&tokens, "tok,admin,admin-uid,\"system:masters\"\n", 0o600);
    let args = |key: &std::path::Path| {
        vec![
            "--standalone".to_string(),
            "--token-auth-file".to_string(),
            tokens_arg.clone(),
            "--tls-cert-file".to_string(),
            cert.display().to_string(),
            "--tls-private-key-file".to_string(),
            key.display().to_string(),
        ]
    };
    let a = args(&key);
    let err = refused_start(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(err.contains("readable by others"), "{err}");
    // With the key private, startup gets past the files (and stops at the unreachable
    // database instead).
    private_file(&key, &generated.signing_key.serialize_pem(), 0o600);
    let err = refused_start(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!err.contains("readable by"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The in-flight caps and the listener timeouts come from flags: a bad value stops startup
/// before anything is bound, and the values given are the ones served with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_caps_and_listener_timeouts_are_flags_and_bad_values_stop_startup() {
    for (flag, value, says) in [
        (
            "--max-requests-inflight",
            "0",
            "--max-requests-inflight must be greater than 0",
        ),
        (
            "--max-mutating-requests-inflight",
            "0",
            "--max-mutating-requests-inflight must be greater than 0",
        ),
        (
            "--max-mutating-requests-inflight",
            "-5",
            "invalid value '-5'",
        ),
        (
            "--max-mutating-requests-inflight",
            "lots",
            "invalid value 'lots'",
        ),
        (
            "--header-read-timeout",
            "0s",
            "--header-read-timeout must be greater than 0",
        ),
        ("--header-read-timeout", "soon", "invalid duration"),
        (
            "--tls-handshake-timeout",
            "0",
            "--tls-handshake-timeout must be greater than 0",
        ),
        ("--tls-handshake-timeout", "-1s", "invalid"),
    ] {
        let err = refused_start(&[
            "--standalone",
            "--token-auth-file",
            "/nonexistent/tokens.csv",
            &format!("{flag}={value}"),
        ]);
        assert!(err.contains(says), "{flag}={value}: {err}");
        // Refused on the flag, before the token file was looked at.
        assert!(!err.contains("tokens.csv"), "{flag}={value}: {err}");
    }

    let bin = Binary::start(
        &[
            "--header-read-timeout",
            "1s",
            "--tls-handshake-timeout",
            "1s",
            "--max-mutating-requests-inflight",
            "1",
        ],
        None,
    )
    .await;
    // A handshake that never starts and headers that never end are closed after 1 s.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", bin.port))
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(6), silent.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    let took = started.elapsed();
    // Expected 1 s (--tls-handshake-timeout); the upper bound keeps a 5x margin.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let tls = tls_connector_for(&bin.ca_pem);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", bin.port))
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut slow = tls.connect(name, tcp).await.unwrap();
    slow.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    let started = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the unfinished headers kept the connection for 5 s"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    // One write in flight at most: a second one while the first is held is 429.
    let mut held = tls
        .connect(
            rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tokio::net::TcpStream::connect(("127.0.0.1", bin.port))
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let collection = format!("/apis/{}/namespaces/caps/accesssessions", apis::API_VERSION);
    held.write_all(
        format!(
            "POST {collection} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{",
            bin.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    held.flush().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = bin
            .http()
            .post(format!("{}{collection}", bin.url()))
            .bearer_auth(&bin.token)
            .json(&session_json("s1"))
            .send()
            .await
            .unwrap();
        if resp.status() == 429 {
            assert_eq!(resp.headers().get("retry-after").unwrap(), "1");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "answered {}, never 429",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Reads have their own pool.
    assert_eq!(bin.version().await, 200);
    drop(held);
}

fn tls_connector_for(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Local addresses (hex, as /proc/net/tcp shows them) the process listens on at `port`.
fn listening_addresses(pid: u32, port: u16) -> Vec<String> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (addr, p) = cols.get(1)?.split_once(':')?;
            (cols.get(3) == Some(&"0A") && u16::from_str_radix(p, 16).ok()? == port)
                .then(|| addr.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_listen_on_loopback_only() {
    let bin = Binary::start(
        &[
            "--bind-address",
            "0.0.0.0",
            "--metrics-bind-address",
            "127.0.0.1",
        ],
        None,
    )
    .await;
    let pid = bin.child.id();
    assert_eq!(listening_addresses(pid, bin.metrics_port), ["0100007F"]);
    assert_eq!(listening_addresses(pid, bin.port), ["00000000"]);
}

/// The binary's /metrics exposes every family operators watch: request counts and latency
/// by verb/resource/code, watchers by resource and watch cut-offs, the change feed's head,
/// lag and cut-offs, and the authentication caches' lookups. A watch and a request are
/// made first so the labelled families have samples, not only their HELP lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_every_family() {
    let bin = Binary::start(&[], None).await;
    let sessions = format!(
        "{}/apis/{}/namespaces/metrics/accesssessions",
        bin.url(),
        apis::API_VERSION
    );
    let list = bin
        .http()
        .get(&sessions)
        .bearer_auth(&bin.token)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let watch = bin
        .http()
        .get(format!("{sessions}?watch=true"))
        .bearer_auth(&bin.token)
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let metrics_url = format!("http://127.0.0.1:{}/metrics", bin.metrics_port);
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // The watch counts once its task runs; the feed gauges once the check has ticked.
        if text.contains("\nmcp_access_apiserver_watchers{resource=\"accesssessions\"} 1\n")
            && text.contains("\nmcp_access_apiserver_change_feed_live 1\n")
            && text.contains("\nmcp_access_apiserver_change_feed_subscribers 1\n")
        {
            break text;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for family in [
        "# TYPE mcp_access_apiserver_requests counter",
        "# TYPE mcp_access_apiserver_request_duration_seconds histogram",
        "# TYPE mcp_access_apiserver_open_watches gauge",
        "# TYPE mcp_access_apiserver_watchers gauge",
        "# TYPE mcp_access_apiserver_watch_cutoffs counter",
        "# TYPE mcp_access_apiserver_change_feed_head gauge",
        "# TYPE mcp_access_apiserver_change_feed_lag_events gauge",
        "# TYPE mcp_access_apiserver_change_feed_lag_seconds gauge",
        "# TYPE mcp_access_apiserver_change_feed_live gauge",
        "# TYPE mcp_access_apiserver_change_feed_subscribers gauge",
        "# TYPE mcp_access_apiserver_change_feed_cutoffs counter",
        "# TYPE mcp_access_apiserver_auth_cache_lookups counter",
    ] {
        assert!(
            text.contains(family),
            "{family} missing from /metrics:\n{text}"
        );
    }
    assert!(
        text.contains(
            "mcp_access_apiserver_request_duration_seconds_count{verb=\"list\",resource=\"accesssessions\",code=\"200\"} 1"
        ),
        "{text}"
    );
    // Counters exist from the start, at zero, so rates and ratios need no special case.
    assert!(
        text.contains(
            "\nmcp_access_apiserver_watch_cutoffs_total{resource=\"accesssessions\",reason=\"Expired\"} 0\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "\nmcp_access_apiserver_change_feed_cutoffs_total{reason=\"slow_consumer\"} 0\n"
        ),
        "{text}"
    );
    drop(watch);
}
