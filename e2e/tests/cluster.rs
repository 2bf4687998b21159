//! End-to-end scenarios against a real etcd + kube-apiserver + kube-controller-manager with
//! MCP Access behind its APIService and RBAC on. One cluster serves every scenario (start-up
//! takes seconds); each scenario works in namespaces of its own. A plain `main` runs them in
//! order so the cluster is always torn down, and reports each by name.
//!
//! Needs (set by `hack/test.sh`): MCP_TEST_DATABASE_URL, MCP_ACCESS_APISERVER_BIN,
//! MCP_ACCESS_INFORMER_BIN, MCP_ACCESS_GATEWAY_INFORMER_BIN, MCP_ACCESS_CONTROLLERS_BIN,
//! MCP_ACCESS_KUBECTL_ACCESS_BIN.
//!
//! Arguments are libtest's (`e2e::harness`): filters, `--exact`, `--skip`, `--list`; the other
//! harness flags and their values are accepted and ignored. A selection of zero scenarios fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use e2e::harness::{Args, Shard};
use e2e::{Database, LocalCluster, Options};
use serde_json::Value;

#[path = "cluster/delegated_auth.rs"]
mod delegated_auth;

type Scenario = fn(&mut LocalCluster) -> Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

#[path = "cluster/contexts.rs"]
mod contexts;
#[path = "cluster/controllers.rs"]
mod controllers;
#[path = "cluster/deploy_manifests.rs"]
mod deploy_manifests;
#[path = "cluster/drain.rs"]
mod drain;
#[path = "cluster/egress_refresh.rs"]
mod egress_refresh;
#[path = "cluster/expiry.rs"]
mod expiry;
#[path = "cluster/fences.rs"]
mod fences;
#[path = "cluster/gateway_cache.rs"]
mod gateway_cache;
#[path = "cluster/gateway_isolation.rs"]
mod gateway_isolation;
#[path = "cluster/host_api.rs"]
mod host_api;
#[path = "cluster/host_local.rs"]
mod host_local;
#[path = "cluster/hosts.rs"]
mod hosts;
#[path = "cluster/kubectl_access.rs"]
mod kubectl_access;
#[path = "cluster/mcp_gateway.rs"]
mod mcp_gateway;
#[path = "cluster/monitoring.rs"]
mod monitoring;
#[path = "cluster/netpol.rs"]
mod netpol;
#[path = "cluster/nginx_proxy.rs"]
mod nginx_proxy;
#[path = "cluster/node.rs"]
mod node;
#[path = "cluster/retire.rs"]
mod retire;
#[path = "cluster/roles.rs"]
mod roles;
#[path = "cluster/server_side_apply.rs"]
mod server_side_apply;
#[path = "cluster/tool_policies.rs"]
mod tool_policies;

/// Every scenario, in the order they run: a plain array, so additions merge cleanly.
const SCENARIOS: &[(&str, Scenario)] = &[
    (
        "controllers_mcpserver_yields_its_gateway_workload",
        controllers::mcpserver_yields_its_gateway_workload,
    ),
    (
        "controllers_missing_secret_blocks_until_it_appears",
        controllers::missing_secret_blocks_until_it_appears,
    ),
    (
        "controllers_enforce_mode_refuses_a_disallowed_image",
        controllers::enforce_mode_refuses_a_disallowed_image,
    ),
    (
        "controllers_audit_mode_deploys_a_disallowed_image_with_a_warning",
        controllers::audit_mode_deploys_a_disallowed_image_with_a_warning,
    ),
    (
        "controllers_stdio_and_remote_servers_take_their_shape",
        controllers::stdio_and_remote_servers_take_their_shape,
    ),
    (
        "controllers_standby_takes_over_after_the_leader_is_killed",
        controllers::standby_takes_over_after_the_leader_is_killed,
    ),
    (
        "controllers_noop_resync_of_200_mcpservers_writes_nothing",
        controllers::noop_resync_of_200_mcpservers_writes_nothing,
    ),
    (
        "apiservice_available_and_discoverable",
        apiservice_available_and_discoverable,
    ),
    (
        "crud_and_watch_through_kube_apiserver",
        crud_and_watch_through_kube_apiserver,
    ),
    ("rbac_limits_users", rbac_limits_users),
    (
        "server_side_apply_conflicts_and_rbac_through_kube_apiserver",
        server_side_apply::apply_conflicts_and_rbac_through_kube_apiserver,
    ),
    (
        "forged_headers_without_proxy_certificate_are_refused",
        forged_headers_are_refused,
    ),
    ("namespace_lifecycle", namespace_lifecycle),
    (
        "revokers_and_enrollers_through_rbac",
        revokers_and_enrollers_through_rbac,
    ),
    (
        "default_roles_matrix_through_kube_apiserver",
        roles::default_roles_matrix,
    ),
    (
        "fence_scope_follows_the_revokers_rbac",
        fences::fence_scope_follows_rbac,
    ),
    (
        "client_go_informer_stays_synced_across_restart",
        client_go_informer_stays_synced_across_restart,
    ),
    (
        "front_proxy_user_without_rbac_is_denied_by_mcp_access",
        delegated_auth::front_proxy_user_without_rbac_is_denied_by_mcp_access,
    ),
    (
        "front_proxy_certificate_with_disallowed_cn_is_not_trusted",
        delegated_auth::front_proxy_certificate_with_disallowed_cn_is_not_trusted,
    ),
    (
        "removed_rolebinding_takes_effect_within_the_cache_ttl",
        delegated_auth::removed_rolebinding_takes_effect_within_the_cache_ttl,
    ),
    (
        "kube_apiserver_unreachable_answers_503",
        delegated_auth::kube_apiserver_unreachable_answers_503,
    ),
    (
        "gateway_lists_only_its_servers_sessions",
        gateway_isolation::gateway_lists_only_its_servers_sessions,
    ),
    (
        "gateway_get_of_another_servers_session_is_not_found",
        gateway_isolation::gateway_get_of_another_servers_session_is_not_found,
    ),
    (
        "gateway_selectors_never_widen_its_scope",
        gateway_isolation::gateway_selectors_never_widen_its_scope,
    ),
    (
        "gateway_watches_only_its_servers_sessions",
        gateway_isolation::gateway_watches_only_its_servers_sessions,
    ),
    (
        "gateway_streaming_list_sends_only_its_servers_sessions",
        gateway_isolation::gateway_streaming_list_sends_only_its_servers_sessions,
    ),
    (
        "gateway_token_with_wrong_audience_is_unauthorized",
        gateway_isolation::gateway_token_with_wrong_audience_is_unauthorized,
    ),
    (
        "gateway_token_without_pod_binding_is_unauthorized",
        gateway_isolation::gateway_token_without_pod_binding_is_unauthorized,
    ),
    (
        "gateway_token_of_a_deleted_pod_is_unauthorized",
        gateway_isolation::gateway_token_of_a_deleted_pod_is_unauthorized,
    ),
    (
        "gateway_token_of_a_recreated_pod_is_unauthorized",
        gateway_isolation::gateway_token_of_a_recreated_pod_is_unauthorized,
    ),
    (
        "gateway_token_after_replicaset_recreated_is_unauthorized",
        gateway_isolation::gateway_token_after_replicaset_recreated_is_unauthorized,
    ),
    (
        "gateway_token_after_deployment_recreated_is_unauthorized",
        gateway_isolation::gateway_token_after_deployment_recreated_is_unauthorized,
    ),
    (
        "gateway_token_after_mcpserver_recreated_is_unauthorized",
        gateway_isolation::gateway_token_after_mcpserver_recreated_is_unauthorized,
    ),
    (
        "gateway_token_of_a_deleting_mcpserver_is_unauthorized",
        gateway_isolation::gateway_token_of_a_deleting_mcpserver_is_unauthorized,
    ),
    (
        "gateway_token_of_a_pod_outside_an_mcpserver_chain_is_unauthorized",
        gateway_isolation::gateway_token_of_a_pod_outside_an_mcpserver_chain_is_unauthorized,
    ),
    (
        "gateway_token_of_a_deployment_the_controllers_did_not_make_is_unauthorized",
        gateway_isolation::gateway_token_of_a_deployment_the_controllers_did_not_make_is_unauthorized,
    ),
    (
        "plain_user_credentials_are_unauthorized_on_the_sync_listener",
        gateway_isolation::plain_user_credentials_are_unauthorized_on_the_sync_listener,
    ),
    (
        "gateway_token_is_unauthorized_on_the_api",
        gateway_isolation::gateway_token_is_unauthorized_on_the_api,
    ),
    (
        "writes_on_the_sync_listener_are_method_not_allowed",
        gateway_isolation::writes_on_the_sync_listener_are_method_not_allowed,
    ),
    (
        "other_resources_on_the_sync_listener_are_not_found",
        gateway_isolation::other_resources_on_the_sync_listener_are_not_found,
    ),
    (
        "open_watch_ends_when_the_deployment_is_deleted",
        gateway_isolation::open_watch_ends_when_the_deployment_is_deleted,
    ),
    (
        "client_go_gateway_informer_sees_only_its_servers_sessions",
        gateway_isolation::client_go_gateway_informer_sees_only_its_servers_sessions,
    ),
    (
        "gateway_cache_revoke_to_deny",
        gateway_cache::revoke_to_deny_through_kube_apiserver,
    ),
    (
        "gateway_cache_cold_warm_stale",
        gateway_cache::cold_warm_stale,
    ),
    (
        "gateway_cache_apiserver_restart",
        gateway_cache::apiserver_restart_relists_and_converges,
    ),
    (
        "gateway_cache_retire_and_republish",
        gateway_cache::retire_and_republish,
    ),
    (
        "nginx_config_in_the_docs_is_the_one_tested",
        nginx_proxy::nginx_config_in_the_docs_is_the_one_tested,
    ),
    (
        "nginx_auth_request_passes_and_denies",
        nginx_proxy::nginx_auth_request_passes_and_denies,
    ),
    ("nginx_revoke_to_deny", nginx_proxy::nginx_revoke_to_deny),
    (
        "retire_fences_the_uid_then_releases",
        retire::deleting_an_mcpserver_fences_its_uid,
    ),
    (
        "retire_waits_for_the_access_api",
        retire::retirement_waits_for_the_access_api,
    ),
    (
        "retire_in_a_deleted_namespace",
        retire::deleting_the_namespace_fences_its_servers,
    ),
    (
        "session_expires_within_a_second",
        expiry::session_expires_within_a_second,
    ),
    (
        "session_events_through_kubectl_events",
        expiry::session_events_through_kubectl_events,
    ),
    (
        "drain_a_watch_through_the_aggregator_ends_cleanly_and_resumes_after_a_restart",
        drain::a_watch_through_the_aggregator_ends_cleanly_and_resumes_after_a_restart,
    ),
    (
        "deploy_manifests_apply_with_server_dry_run",
        deploy_manifests::apply_with_server_dry_run,
    ),
    (
        "deploy_manifests_container_args_parse",
        deploy_manifests::container_args_parse,
    ),
    (
        "netpol_policies_follow_servers_and_contexts",
        netpol::policies_follow_servers_and_contexts,
    ),
    (
        "netpol_orphan_sweep_over_the_cap_deletes_nothing",
        netpol::orphan_sweep_over_the_cap_deletes_nothing,
    ),
    (
        "netpol_a_deleted_context_takes_all_its_allows",
        netpol::a_deleted_context_takes_all_its_allows,
    ),
    (
        "netpol_servers_outside_the_runtime_namespaces",
        netpol::servers_outside_the_runtime_namespaces,
    ),
    (
        "egress_refresh_a_failed_refresh_withdraws_the_allow_until_the_name_resolves",
        egress_refresh::a_failed_refresh_withdraws_the_allow_until_the_name_resolves,
    ),
    (
        "hosts_missing_secret_blocks_until_it_appears",
        hosts::missing_secret_blocks_until_it_appears,
    ),
    (
        "hosts_image_allow_list_holds_back_a_disallowed_image",
        hosts::image_allow_list_holds_back_a_disallowed_image,
    ),
    (
        "hosts_a_name_held_by_another_object_is_left_alone",
        hosts::a_name_held_by_another_object_is_left_alone,
    ),
    (
        "hosts_workspace_grows_and_never_shrinks",
        hosts::workspace_grows_and_never_shrinks,
    ),
    (
        "hosts_egress_follows_the_context",
        hosts::egress_follows_the_context,
    ),
    (
        "hosts_deleting_a_host_removes_its_runtime",
        hosts::deleting_a_host_removes_its_runtime,
    ),
    (
        "hosts_orphan_sweep_respects_the_caps",
        hosts::orphan_sweep_respects_the_caps,
    ),
    (
        "hosts_binding_a_context_needs_use",
        hosts::binding_a_context_needs_use,
    ),
    (
        "contexts_status_follows_servers_and_consent",
        contexts::status_follows_servers_and_consent,
    ),
    (
        "kubectl_access_who_can_lists_the_sessions_that_grant_now",
        kubectl_access::who_can_lists_the_sessions_that_grant_now,
    ),
    (
        "kubectl_access_revoke_waits_and_prints_what_was_revoked",
        kubectl_access::revoke_waits_and_prints_what_was_revoked,
    ),
    (
        "kubectl_access_retire_asks_before_fencing",
        kubectl_access::retire_asks_before_fencing,
    ),
    (
        "kubectl_access_enroll_complete_and_withdraw",
        kubectl_access::enroll_complete_and_withdraw,
    ),
    (
        "kubectl_access_status_reports_every_part",
        kubectl_access::status_reports_every_part,
    ),
    (
        "kubectl_access_token_prints_a_session_token",
        kubectl_access::token_prints_a_session_token,
    ),
    (
        "monitoring_rules_and_dashboard_match_the_scrapes",
        monitoring::rules_and_dashboard_match_the_scrapes,
    ),
    (
        "host_api_token_matrix_each_refused_with_the_same_401",
        host_api::token_matrix,
    ),
    (
        "host_api_configuration_failures_exit_nonzero",
        host_api::configuration_failures_exit_nonzero,
    ),
    (
        "host_api_cross_context_isolation",
        host_api::cross_context_isolation,
    ),
    (
        "host_api_rate_limit_recovers_in_the_next_window",
        host_api::rate_limit_recovers_in_the_next_window,
    ),
    (
        "host_api_healthz_and_legacy_routes",
        host_api::healthz_and_legacy_routes,
    ),
    (
        "host_api_sessions_tokens_revocation_and_pending",
        host_api::sessions_tokens_revocation_and_pending,
    ),
    (
        "host_token_sh_signs_what_the_local_host_api_accepts",
        host_local::host_token_sh_signs_what_the_local_host_api_accepts,
    ),
    (
        "host_runtime_token_kept_for_each_host",
        host_local::runtime_token_kept_for_each_host,
    ),
    (
        "mcp_gateway_sdk_clients_initialize_list_and_call",
        mcp_gateway::sdk_clients_initialize_list_and_call,
    ),
    (
        "mcp_gateway_denies_with_each_reason",
        mcp_gateway::denies_with_each_reason,
    ),
    (
        "mcp_gateway_sdk_clients_see_and_call_only_granted_tools",
        mcp_gateway::sdk_clients_see_and_call_only_granted_tools,
    ),
    (
        "tool_policies_through_kubectl",
        tool_policies::through_kubectl,
    ),
    (
        "mcp_gateway_sdk_clients_under_tool_policies",
        mcp_gateway::sdk_clients_under_tool_policies,
    ),
    (
        "mcp_gateway_open_stream_cut_on_revocation",
        mcp_gateway::open_stream_cut_on_revocation,
    ),
    (
        "mcp_gateway_retired_and_republished_server_refuses_the_old_token",
        mcp_gateway::retired_and_republished_server_refuses_the_old_token,
    ),
    (
        "mcp_gateway_host_sessions_through_the_gateway",
        mcp_gateway::host_sessions_through_the_gateway,
    ),
];

/// The scenarios of a cluster with a node (`MCP_ACCESS_E2E_NODE=1`, `hack/node.sh`): Pods run
/// and NetworkPolicies are enforced. One node per machine, so they are one group of their own.
const NODE_SCENARIOS: &[(&str, Scenario)] = &[
    (
        "node_packets_follow_the_contexts",
        node::packets_follow_the_contexts,
    ),
    (
        "node_revocation_cuts_a_host_pod_within_a_second",
        node::revocation_cuts_a_host_pod_within_a_second,
    ),
    (
        "node_egress_reaches_only_the_bound_address",
        node::egress_reaches_only_the_bound_address,
    ),
    (
        "node_second_node_on_the_machine_is_refused",
        node::second_node_on_the_machine_is_refused,
    ),
    // Near the end: it takes the APIService and the controllers' Lease while it runs.
    (
        "node_deploy_manifests_run_as_installed",
        node::deploy_manifests_run_as_installed,
    ),
    // Last: it stops and restarts the node.
    (
        "node_kubelet_never_ready_fails_the_start_loudly",
        node::kubelet_never_ready_fails_the_start_loudly,
    ),
];

fn main() {
    let with_node = std::env::var("MCP_ACCESS_E2E_NODE").is_ok_and(|v| v == "1");
    let scenarios = if with_node { NODE_SCENARIOS } else { SCENARIOS };
    let names: Vec<&str> = scenarios.iter().map(|(name, _)| *name).collect();
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("e2e: {e}");
            std::process::exit(2);
        }
    };
    if args.list {
        for name in &names {
            println!("{name}: test");
        }
        return;
    }
    // Decided before anything starts: a filter that matches nothing fails at once.
    let selected = match args.select(&names) {
        Ok(selected) => selected,
        Err(e) => {
            eprintln!("e2e: {e}");
            std::process::exit(1);
        }
    };
    if selected.is_empty() {
        println!("e2e: asked for ignored tests or benchmarks only; the scenarios are neither");
        return;
    }
    // This run's part of the selection (MCP_ACCESS_E2E_SHARD), decided before anything starts.
    let shard = match Shard::from_env() {
        Ok(shard) => shard,
        Err(e) => {
            eprintln!("e2e: {e}");
            std::process::exit(2);
        }
    };
    let selected = shard.take(&selected);
    if selected.is_empty() {
        println!(
            "e2e: part {} of {} has no scenarios of this selection",
            shard.index + 1,
            shard.count
        );
        return;
    }
    let need = |name: &str| {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is not set: run through hack/test.sh"))
    };
    let dir =
        std::env::temp_dir().join(format!("mcp-access-e2e-{}", uuid::Uuid::new_v4().simple()));
    let mut cluster = LocalCluster::start(Options {
        dir: dir.clone(),
        apiserver_bin: PathBuf::from(need("MCP_ACCESS_APISERVER_BIN")),
        database: Database::CreateIn(need("MCP_TEST_DATABASE_URL")),
        // Short, so the scenarios see a watch end soon after a gateway chain breaks.
        apiserver_args: vec!["--gateway-reverify-interval=2s".into()],
        node: with_node,
    })
    .expect("local cluster starts");
    if with_node {
        let gateway = PathBuf::from(need("MCP_ACCESS_GATEWAY_BIN"));
        e2e::node::import_images(&cluster, &gateway)
            .expect("the node's images are built and imported");
    }

    println!(
        "running {} of {} scenarios (part {} of {})",
        selected.len(),
        scenarios.len(),
        shard.index + 1,
        shard.count
    );
    let mut failed = Vec::new();
    let mut passed = 0usize;
    for (name, scenario) in scenarios.iter().filter(|(n, _)| selected.contains(n)) {
        let started = Instant::now();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&mut cluster)))
                .unwrap_or_else(|p| {
                    Err(p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default())
                });
        match result {
            Ok(()) => {
                passed += 1;
                println!(
                    "test {name} ... ok ({:.1}s)",
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) => {
                println!(
                    "test {name} ... FAILED ({:.1}s)\n    {e}",
                    started.elapsed().as_secs_f64()
                );
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        let log =
            std::fs::read_to_string(dir.join("logs/mcp-access-apiserver.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("--- last lines of mcp-access-apiserver.log ---");
        for l in tail.iter().rev() {
            eprintln!("{l}");
        }
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
    let filtered_out = scenarios.len() - selected.len();
    if failed.is_empty() && passed == selected.len() {
        println!("e2e: ok. {passed} passed; 0 failed; {filtered_out} filtered out");
    } else {
        println!(
            "e2e: FAILED. {passed} passed; {} failed {failed:?}; {filtered_out} filtered out",
            failed.len()
        );
        std::process::exit(1);
    }
}

fn ok(out: &e2e::Output, what: &str) -> Result<String, String> {
    if out.success {
        Ok(out.stdout.clone())
    } else {
        Err(format!("{what} failed: {}{}", out.stdout, out.stderr))
    }
}

fn session_yaml(name: &str, server_uid: &str) -> String {
    let expires = "2099-01-01T00:00:00Z";
    format!(
        "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: AccessSession\nmetadata:\n  name: {name}\n  labels: {{team: payments}}\nspec:\n  server: {{name: github, uid: {server_uid}}}\n  teams: [payments]\n  expiresAt: \"{expires}\"\n"
    )
}

fn create_namespace(c: &LocalCluster, ns: &str) -> Result<(), String> {
    ok(&c.kubectl(&["create", "namespace", ns]), "create namespace").map(|_| ())
}

/// A kubeconfig holding only a token of a new service account `sa` in `ns`.
fn service_account_kubeconfig(c: &LocalCluster, ns: &str, sa: &str) -> Result<PathBuf, String> {
    ok(
        &c.kubectl(&["create", "serviceaccount", sa, "-n", ns]),
        "create serviceaccount",
    )?;
    let token = ok(
        &c.kubectl(&["create", "token", sa, "-n", ns, "--duration=1h"]),
        "create token",
    )?;
    let server = c.env.get("KUBE_APISERVER_URL").cloned().unwrap_or_default();
    let ca = c.env.get("CLUSTER_CA_FILE").cloned().unwrap_or_default();
    let path = c.dir.join(format!("kubeconfig-{ns}-{sa}"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u, namespace: {ns}}}\ncurrent-context: c\n",
            token.trim()
        ),
    )
    .map_err(|e| e.to_string())?;
    Ok(path)
}

fn apiservice_available_and_discoverable(c: &mut LocalCluster) -> Result<(), String> {
    let status = ok(
        &c.kubectl(&[
            "get",
            "apiservice",
            "v1alpha1.access.mcp-runtime.dev",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
        ]),
        "get apiservice",
    )?;
    ensure!(
        status.trim() == "True",
        "APIService not Available: {status}"
    );
    let resources = ok(
        &c.kubectl(&["api-resources", "--api-group=access.mcp-runtime.dev"]),
        "api-resources",
    )?;
    ensure!(
        resources.contains("accesssessions")
            && resources.contains("acs")
            && resources.contains("agents"),
        "{resources}"
    );
    // This scenario runs first, right after LocalCluster::start returned, which is when
    // hack/up.sh prints KUBECONFIG=: explain must work at the first attempt, with a
    // discovery cache of its own (as a user's first kubectl has).
    let fresh_cache = c.dir.join("fresh-kube-cache");
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["explain", "accesssession.spec"])
        .env("KUBECACHEDIR", &fresh_cache)
        .env_remove("KUBECONFIG")
        .output()
        .map_err(|e| e.to_string())?;
    ensure!(
        out.status.success(),
        "kubectl explain failed right after start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let explain = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        explain.contains("expiresAt") && explain.contains("server"),
        "{explain}"
    );
    let explain = ok(&c.kubectl(&["explain", "accesssession"]), "explain")?;
    ensure!(
        explain.contains("KIND:       AccessSession") || explain.contains("AccessSession"),
        "{explain}"
    );
    Ok(())
}

fn crud_and_watch_through_kube_apiserver(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-crud";
    create_namespace(c, ns)?;
    let agent = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: e2e-bot\nspec:\n  teams: [payments]\n";
    ok(
        &c.kubectl_as(&c.kubeconfig.clone(), &["apply", "-f", "-"], Some(agent)),
        "apply agent",
    )?;
    let created = c.kubectl_as(
        &c.kubeconfig.clone(),
        &["apply", "-n", ns, "-f", "-"],
        Some(&session_yaml("s1", "srv-e2e")),
    );
    ok(&created, "apply session")?;
    ensure!(
        created
            .stdout
            .contains("accesssession.access.mcp-runtime.dev/s1 created"),
        "{}",
        created.stdout
    );
    let table = ok(&c.kubectl(&["get", "acs", "-n", ns]), "get")?;
    ensure!(
        table.starts_with("NAME")
            && table.contains("SERVER")
            && table.contains("PHASE")
            && table.contains("s1"),
        "{table}"
    );
    let agents = ok(&c.kubectl(&["get", "agents"]), "get agents")?;
    ensure!(
        agents.contains("e2e-bot") && agents.contains("ACTIVE"),
        "{agents}"
    );

    // get -w sees a change made by another client.
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["get", "acs", "-n", ns, "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = watch.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| "watch printed nothing".to_string())?;
    ensure!(first.contains("EVENT"), "header expected, got {first}");
    let patch = c.kubectl(&[
        "patch",
        "acs",
        "s1",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"color":"blue"}}}"#,
    ]);
    ok(&patch, "patch")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen_modified = false;
    while Instant::now() < deadline && !seen_modified {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            seen_modified = line.contains("MODIFIED") && line.contains("s1");
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    ensure!(
        seen_modified,
        "kubectl get -w did not show the MODIFIED event"
    );

    let got: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "s1", "-n", ns, "-o", "json"]),
        "get json",
    )?)
    .map_err(|e| e.to_string())?;
    ensure!(got["metadata"]["labels"]["color"] == "blue", "{got}");
    let deleted = ok(&c.kubectl(&["delete", "acs", "s1", "-n", ns]), "delete")?;
    ensure!(deleted.contains("deleted"), "{deleted}");
    let gone = c.kubectl(&["get", "acs", "s1", "-n", ns]);
    ensure!(
        !gone.success && gone.stderr.contains("NotFound"),
        "{gone:?}"
    );
    ok(&c.kubectl(&["delete", "agent", "e2e-bot"]), "delete agent")?;
    Ok(())
}

fn rbac_limits_users(c: &mut LocalCluster) -> Result<(), String> {
    let (mine, theirs) = ("e2e-rbac-a", "e2e-rbac-b");
    create_namespace(c, mine)?;
    create_namespace(c, theirs)?;
    for ns in [mine, theirs] {
        ok(
            &c.kubectl_as(
                &c.kubeconfig.clone(),
                &["apply", "-n", ns, "-f", "-"],
                Some(&session_yaml("s1", "srv-rbac")),
            ),
            "seed",
        )?;
    }
    let viewer = service_account_kubeconfig(c, mine, "viewer")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "viewer",
            "-n",
            mine,
            "--clusterrole=view",
            &format!("--serviceaccount={mine}:viewer"),
        ]),
        "rolebinding",
    )?;
    // RBAC decisions are cached for seconds by design; retry until the binding is visible.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = c.kubectl_as(&viewer, &["get", "acs", "-n", mine], None);
        if listed.success && listed.stdout.contains("s1") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "viewer cannot list its namespace: {listed:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let created = c.kubectl_as(
        &viewer,
        &["create", "-n", mine, "-f", "-"],
        Some(&session_yaml("s2", "srv-rbac")),
    );
    ensure!(
        !created.success
            && created.stderr.contains("Forbidden")
            && created.stderr.contains(
                "cannot create resource \"accesssessions\" in API group \"access.mcp-runtime.dev\""
            ),
        "view must not create: {created:?}"
    );
    let other = c.kubectl_as(&viewer, &["get", "acs", "-n", theirs], None);
    ensure!(
        !other.success && other.stderr.contains("cannot list resource"),
        "other namespace: {other:?}"
    );
    let all = c.kubectl_as(&viewer, &["get", "acs", "-A"], None);
    ensure!(
        !all.success && all.stderr.contains("at the cluster scope"),
        "all namespaces: {all:?}"
    );
    let watch = c.kubectl_as(
        &viewer,
        &["get", "acs", "-n", theirs, "-w", "--request-timeout=10s"],
        None,
    );
    ensure!(
        !watch.success && watch.stderr.contains("Forbidden"),
        "watch other namespace: {watch:?}"
    );
    let deleted = c.kubectl_as(&viewer, &["delete", "acs", "s1", "-n", mine], None);
    ensure!(
        !deleted.success && deleted.stderr.contains("cannot delete resource"),
        "{deleted:?}"
    );

    // Only a revoker may revoke, and an editor is not a revoker.
    let editor = service_account_kubeconfig(c, mine, "editor")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "editor",
            "-n",
            mine,
            "--clusterrole=edit",
            &format!("--serviceaccount={mine}:editor"),
        ]),
        "rolebinding",
    )?;
    let can = c.kubectl_as(
        &editor,
        &[
            "auth",
            "can-i",
            "create",
            "revocations.access.mcp-runtime.dev",
            "-n",
            mine,
        ],
        None,
    );
    ensure!(
        can.stdout.trim() == "no",
        "edit must not grant revocations: {can:?}"
    );
    // Nor an issuer: a session names its subject and teams, which edit must not choose.
    eventually(c, &editor, &["get", "acs", "-n", mine], None)?;
    let created = c.kubectl_as(
        &editor,
        &["create", "-n", mine, "-f", "-"],
        Some(&session_yaml("s3", "srv-rbac")),
    );
    ensure!(
        !created.success
            && created.stderr.contains("Forbidden")
            && created
                .stderr
                .contains("cannot create resource \"accesssessions\""),
        "edit must not issue sessions: {created:?}"
    );
    Ok(())
}

fn forged_headers_are_refused(c: &mut LocalCluster) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = std::fs::read(
        c.env
            .get("AGGREGATED_CA_FILE")
            .ok_or("AGGREGATED_CA_FILE")?,
    )
    .map_err(|e| e.to_string())?;
    let port = c.api_port;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let client = reqwest::Client::builder()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).map_err(|e| e.to_string())?])
            .resolve(
                "mcp-access-apiserver.mcp-access.svc",
                ([127, 0, 0, 1], port).into(),
            )
            .build()
            .map_err(|e| e.to_string())?;
        for path in [
            "/apis/access.mcp-runtime.dev/v1alpha1/namespaces/default/accesssessions",
            "/apis/access.mcp-runtime.dev/v1alpha1/agents",
        ] {
            let response = client
                .get(format!(
                    "https://mcp-access-apiserver.mcp-access.svc:{port}{path}"
                ))
                .header("X-Remote-User", "admin")
                .header("X-Remote-Group", "system:masters")
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let code = response.status().as_u16();
            let body: Value = response.json().await.map_err(|e| e.to_string())?;
            ensure!(
                code == 401 && body["kind"] == "Status" && body["reason"] == "Unauthorized",
                "forged headers: {code} {body}"
            );
        }
        Ok(())
    })
}

fn namespace_lifecycle(c: &mut LocalCluster) -> Result<(), String> {
    let missing = c.kubectl_as(
        &c.kubeconfig.clone(),
        &["create", "-n", "e2e-does-not-exist", "-f", "-"],
        Some(&session_yaml("s1", "srv-ns")),
    );
    ensure!(
        !missing.success
            && missing.stderr.contains("NotFound")
            && missing.stderr.contains("e2e-does-not-exist"),
        "creating in a missing namespace: {missing:?}"
    );
    let ns = "e2e-doomed";
    create_namespace(c, ns)?;
    for i in 0..3 {
        ok(
            &c.kubectl_as(
                &c.kubeconfig.clone(),
                &["apply", "-n", ns, "-f", "-"],
                Some(&session_yaml(&format!("s{i}"), "srv-ns")),
            ),
            "seed",
        )?;
    }
    // A pending enrollment owned by someone else must not keep the namespace from going.
    let enroller = service_account_kubeconfig(c, ns, "enroller")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "enroller",
            "-n",
            ns,
            "--clusterrole=mcp-access-enroller",
            &format!("--serviceaccount={ns}:enroller"),
        ]),
        "rolebinding",
    )?;
    eventually(
        c,
        &enroller,
        &["create", "-n", ns, "-f", "-"],
        Some(&enrollment_yaml("pending")),
    )?;
    ok(
        &c.kubectl(&["delete", "namespace", ns, "--wait=false"]),
        "delete namespace",
    )?;
    let wait = c.kubectl(&[
        "wait",
        "--for=delete",
        &format!("namespace/{ns}"),
        "--timeout=90s",
    ]);
    ensure!(
        wait.success || wait.stderr.contains("not found"),
        "namespace did not finish terminating: {wait:?}"
    );
    let left = ok(
        &c.kubectl(&[
            "get",
            "acs",
            "-A",
            "-o",
            "name",
            "--field-selector",
            &format!("metadata.namespace={ns}"),
        ]),
        "list",
    )?;
    ensure!(left.trim().is_empty(), "sessions left behind: {left}");
    Ok(())
}

fn enrollment_yaml(name: &str) -> String {
    session_yaml(name, "srv-enr").replace("kind: AccessSession", "kind: Enrollment")
}

/// Retries a kubectl call while RBAC caches (seconds, by design) catch up with a new binding.
fn eventually(
    c: &LocalCluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = c.kubectl_as(kubeconfig, args, stdin);
        if out.success {
            return Ok(out.stdout);
        }
        if Instant::now() > deadline {
            return Err(format!("kubectl {} kept failing: {out:?}", args.join(" ")));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn revokers_and_enrollers_through_rbac(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-authority";
    create_namespace(c, ns)?;
    for name in ["target", "other"] {
        ok(
            &c.kubectl_as(
                &c.kubeconfig.clone(),
                &["apply", "-n", ns, "-f", "-"],
                Some(&session_yaml(name, "srv-auth")),
            ),
            "seed",
        )?;
    }
    let revocation = "apiVersion: access.mcp-runtime.dev/v1alpha1\nkind: Revocation\nmetadata:\n  name: pull-target\nspec:\n  target: {session: target}\n  cause: compromised\n  message: key leaked\n";

    // An editor may manage sessions but not revoke.
    let editor = service_account_kubeconfig(c, ns, "editor")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "editor",
            "-n",
            ns,
            "--clusterrole=edit",
            &format!("--serviceaccount={ns}:editor"),
        ]),
        "rolebinding",
    )?;
    eventually(c, &editor, &["get", "acs", "-n", ns], None)?;
    let denied = c.kubectl_as(&editor, &["create", "-n", ns, "-f", "-"], Some(revocation));
    ensure!(
        !denied.success
            && denied
                .stderr
                .contains("cannot create resource \"revocations\""),
        "edit must not revoke: {denied:?}"
    );
    let still: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "target", "-n", ns, "-o", "json"]),
        "get",
    )?)
    .map_err(|e| e.to_string())?;
    ensure!(still["status"]["phase"] == "Active", "{still}");

    // A revoker may.
    let revoker = service_account_kubeconfig(c, ns, "revoker")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "revoker",
            "-n",
            ns,
            "--clusterrole=mcp-access-revoker",
            &format!("--serviceaccount={ns}:revoker"),
        ]),
        "rolebinding",
    )?;
    let created = eventually(
        c,
        &revoker,
        &["create", "-n", ns, "-f", "-"],
        Some(revocation),
    )?;
    ensure!(
        created.contains("revocation.access.mcp-runtime.dev/pull-target created"),
        "{created}"
    );
    let revoked: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "target", "-n", ns, "-o", "json"]),
        "get",
    )?)
    .map_err(|e| e.to_string())?;
    ensure!(
        revoked["status"]["phase"] == "Revoked"
            && revoked["status"]["revocation"]["cause"] == "compromised",
        "{revoked}"
    );
    let audit = ok(&c.kubectl(&["get", "revocations", "-A"]), "audit trail")?;
    ensure!(
        audit.contains("pull-target")
            && audit.contains("session/target")
            && audit.contains("compromised"),
        "{audit}"
    );

    // An enroller requests and withdraws enrollments, but neither completes them (an
    // enrollment approver does) nor touches sessions.
    let enroller = service_account_kubeconfig(c, ns, "enroller")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "enroller",
            "-n",
            ns,
            "--clusterrole=mcp-access-enroller",
            &format!("--serviceaccount={ns}:enroller"),
        ]),
        "rolebinding",
    )?;
    eventually(
        c,
        &enroller,
        &["create", "-n", ns, "-f", "-"],
        Some(&enrollment_yaml("adapter-1")),
    )?;
    let pending: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "adapter-1", "-n", ns, "-o", "json"]),
        "get",
    )?)
    .map_err(|e| e.to_string())?;
    ensure!(
        pending["status"]["phase"] == "PendingEnrollment",
        "{pending}"
    );
    ensure!(
        pending["status"]["enrollment"]["owner"] == format!("system:serviceaccount:{ns}:enroller"),
        "owner is the authenticated creator: {pending}"
    );
    let complete = [
        "patch",
        "enrollment",
        "adapter-1",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Completed"}}"#,
    ];
    let own = c.kubectl_as(&enroller, &complete, None);
    ensure!(
        !own.success
            && own.stderr.contains("Forbidden")
            && own.stderr.contains("resource \"enrollments/status\""),
        "an enroller must not complete enrollments: {own:?}"
    );
    let approver = service_account_kubeconfig(c, ns, "approver")?;
    ok(
        &c.kubectl(&[
            "create",
            "rolebinding",
            "approver",
            "-n",
            ns,
            "--clusterrole=mcp-access-enrollment-approver",
            &format!("--serviceaccount={ns}:approver"),
        ]),
        "rolebinding",
    )?;
    eventually(c, &approver, &complete, None)?;
    let active: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "adapter-1", "-n", ns, "-o", "json"]),
        "get",
    )?)
    .map_err(|e| e.to_string())?;
    ensure!(
        active["status"]["phase"] == "Active" && active["status"].get("enrollment").is_none(),
        "{active}"
    );
    ok(
        &c.kubectl_as(
            &enroller,
            &["create", "-n", ns, "-f", "-"],
            Some(&enrollment_yaml("adapter-2")),
        ),
        "create second",
    )?;
    ok(
        &c.kubectl_as(
            &enroller,
            &["delete", "enrollment", "adapter-2", "-n", ns],
            None,
        ),
        "withdraw",
    )?;
    let gone = c.kubectl(&["get", "acs", "adapter-2", "-n", ns]);
    ensure!(
        !gone.success && gone.stderr.contains("NotFound"),
        "withdrawn session must be gone: {gone:?}"
    );
    // The admin is not the owner: withdrawing someone else's pending enrollment is refused.
    ok(
        &c.kubectl_as(
            &enroller,
            &["create", "-n", ns, "-f", "-"],
            Some(&enrollment_yaml("adapter-3")),
        ),
        "create third",
    )?;
    let not_owner = c.kubectl(&["delete", "enrollment", "adapter-3", "-n", ns]);
    ensure!(
        !not_owner.success && not_owner.stderr.contains("Forbidden"),
        "{not_owner:?}"
    );
    for args in [
        vec![
            "patch",
            "acs",
            "adapter-1",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"metadata":{"labels":{"x":"y"}}}"#,
        ],
        vec!["delete", "acs", "adapter-1", "-n", ns],
    ] {
        let out = c.kubectl_as(&enroller, &args, None);
        ensure!(
            !out.success && out.stderr.contains("Forbidden"),
            "enroller must not {}: {out:?}",
            args[0]
        );
    }
    Ok(())
}

/// Reads the informer's JSON lines; keeps every REQUEST line and its klog output (stderr, in
/// a file) so the scenario can tell which protocol client-go used and how often it relisted.
struct Informer {
    child: std::process::Child,
    lines: mpsc::Receiver<Value>,
    requests: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    stderr: PathBuf,
}

impl Informer {
    fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(v) = self.lines.recv_timeout(Duration::from_millis(200)) {
                if pred(&v) {
                    return Ok(v);
                }
            }
        }
        Err(format!("informer: timed out waiting for {what}"))
    }

    /// The list/watch requests sent so far, as `mode code` (e.g. `watchlist 200`).
    fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .map(|r| {
                r.iter()
                    .map(|v| {
                        format!(
                            "{} {}",
                            v["mode"].as_str().unwrap_or("?"),
                            v["code"]
                                .as_u64()
                                .map(|c| c.to_string())
                                .unwrap_or_else(|| v["error"].to_string())
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn klog(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Completed initial syncs of the reflector: client-go logs "Caches populated" (klog V(2))
    /// each time a list or a streaming list has delivered the whole state.
    fn syncs(&self) -> usize {
        self.klog().matches("Caches populated").count()
    }

    /// The protocol evidence, for error messages.
    fn evidence(&self) -> String {
        let klog = self.klog();
        let tail: Vec<&str> = klog.lines().rev().take(15).collect();
        format!(
            "requests {:?}; {} syncs; klog tail:\n{}",
            self.requests(),
            self.syncs(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Client-go used WatchList only: every list was a streaming list (watch with
    /// sendInitialEvents=true) and it never fell back to a plain LIST.
    fn used_watchlist_only(&self) -> Result<(), String> {
        let requests = self.requests();
        ensure!(
            requests.iter().any(|r| r == "watchlist 200")
                && !requests.iter().any(|r| r.starts_with("list "))
                && !self.klog().contains("Falling back to regular list"),
            "client-go did not use WatchList only: {}",
            self.evidence()
        );
        Ok(())
    }
}

impl Drop for Informer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_state(
    c: &LocalCluster,
    ns: &str,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let list: Value = serde_json::from_str(&ok(
        &c.kubectl(&["get", "acs", "-n", ns, "-o", "json"]),
        "list",
    )?)
    .map_err(|e| e.to_string())?;
    Ok(list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    (
                        i["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        i["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

fn client_go_informer_stays_synced_across_restart(c: &mut LocalCluster) -> Result<(), String> {
    let ns = "e2e-informer";
    create_namespace(c, ns)?;
    ok(
        &c.kubectl_as(
            &c.kubeconfig.clone(),
            &["apply", "-n", ns, "-f", "-"],
            Some(&session_yaml("before", "srv-inf")),
        ),
        "seed",
    )?;
    let bin = std::env::var("MCP_ACCESS_INFORMER_BIN")
        .map_err(|_| "MCP_ACCESS_INFORMER_BIN is not set".to_string())?;
    let stderr_path = c.dir.join("logs/informer.log");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| e.to_string())?;
    // -v=4: client-go logs each completed sync (V(2)) and a WatchList fallback (V(4)).
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args(["--namespace", ns, "-v=4"])
        .env("KUBE_FEATURE_WatchListClient", "true")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = requests.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["type"] == "REQUEST" {
                    if let Ok(mut r) = recorded.lock() {
                        r.push(v.clone());
                    }
                }
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    let informer = Informer {
        child,
        lines: rx,
        requests,
        stderr: stderr_path,
    };
    informer.wait_for("ADDED before", Duration::from_secs(60), |v| {
        v["type"] == "ADDED" && v["name"] == "before"
    })?;
    informer.wait_for("SYNCED", Duration::from_secs(30), |v| v["type"] == "SYNCED")?;
    // The first sync was one streaming list.
    informer.used_watchlist_only()?;
    ensure!(
        informer.syncs() == 1,
        "one initial sync expected: {}",
        informer.evidence()
    );

    // Creates, updates and deletes arrive.
    ok(
        &c.kubectl_as(
            &c.kubeconfig.clone(),
            &["apply", "-n", ns, "-f", "-"],
            Some(&session_yaml("s1", "srv-inf")),
        ),
        "create",
    )?;
    informer.wait_for("ADDED s1", Duration::from_secs(30), |v| {
        v["type"] == "ADDED" && v["name"] == "s1"
    })?;
    ok(
        &c.kubectl(&["label", "acs", "s1", "-n", ns, "color=red"]),
        "label",
    )?;
    informer.wait_for("MODIFIED s1", Duration::from_secs(30), |v| {
        v["type"] == "MODIFIED" && v["name"] == "s1"
    })?;
    ok(&c.kubectl(&["delete", "acs", "before", "-n", ns]), "delete")?;
    informer.wait_for("DELETED before", Duration::from_secs(30), |v| {
        v["type"] == "DELETED" && v["name"] == "before"
    })?;

    // Restart MCP Access rotating the epoch (as after a restore: an ordinary restart keeps
    // it): every open watch ends with Expired, and the informer must relist and keep
    // following.
    ensure!(
        informer.syncs() == 1,
        "no relist expected before the restart: {}",
        informer.evidence()
    );
    let requests_before = informer.requests().len();
    c.start_apiserver_with(&["--rotate-epoch"])
        .map_err(|e| e.to_string())?;
    c.wait_available(Duration::from_secs(90))
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let created = c.kubectl_as(
            &c.kubeconfig.clone(),
            &["apply", "-n", ns, "-f", "-"],
            Some(&session_yaml("after", "srv-inf")),
        );
        if created.success {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "create after restart: {created:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    ok(
        &c.kubectl(&["delete", "acs", "s1", "-n", ns]),
        "delete after restart",
    )?;
    informer.wait_for("ADDED after", Duration::from_secs(60), |v| {
        v["type"] == "ADDED" && v["name"] == "after"
    })?;
    let want = server_state(c, ns)?;
    let want_json: serde_json::Map<String, Value> = want
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    informer
        .wait_for(
            "a cache equal to the server's state",
            Duration::from_secs(60),
            |v| v["type"] == "STATE" && v["items"] == Value::Object(want_json.clone()),
        )
        .map_err(|e| format!("{e}; server has {want:?}"))?;
    // The restart forced exactly one relist, a streaming list again: the resumed watch fails
    // (503 while MCP Access is down, or Expired once the new epoch serves) and client-go
    // lists anew instead of resuming; a second sync is that relist.
    let after: Vec<String> = informer.requests().split_off(requests_before);
    ensure!(
        informer.syncs() == 2 && after.iter().any(|r| r == "watchlist 200"),
        "the restart did not force one relist: requests after it {after:?}; {}",
        informer.evidence()
    );
    informer.used_watchlist_only()?;
    eprintln!(
        "informer: requests {:?}, {} syncs",
        informer.requests(),
        informer.syncs()
    );
    Ok(())
}
