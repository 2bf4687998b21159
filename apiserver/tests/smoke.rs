mod support;

use support::server::{TestServer, ADMIN_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_discovery_to_kubectl_and_http() {
    let server = TestServer::start().await;
    let out = server
        .kubectl(&["api-resources", "--api-group=access.mcp-runtime.dev"])
        .await;
    support::kubectl::ok(&out);
    assert!(out.stdout.contains("accesssessions"), "{}", out.stdout);
    let resp = server
        .http()
        .get(format!("{}/apis", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = server
        .http()
        .get(format!("{}/apis", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}
