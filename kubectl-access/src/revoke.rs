//! `revoke` and `retire`: create a Revocation, wait until the server reports it applied
//! (`status.completedAt`), then show the sessions it covers.

use std::io::BufRead;
use std::time::{Duration, Instant};

use apis::types::{
    AccessSession, Revocation, RevocationSpec, RevocationTarget, ServerRef, SessionPhase,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};

use crate::cli::{RetireArgs, RevocationArgs, RevokeArgs};
use crate::client::Context;
use crate::error::{CliError, Result};
use crate::render;
use crate::sessions::{selector_value, session_table};

/// The cause that turns a server revocation into a permanent fence.
pub const SERVER_RETIRED: &str = "server_retired";

/// The MCPServer custom resource (CRD `mcpservers.mcp-runtime.dev`).
pub fn mcpserver_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("mcp-runtime.dev", "v1alpha1", "MCPServer"),
        "mcpservers",
    )
}

/// A `metadata.generateName` for a revocation of `target`: a DNS-1123 prefix built from
/// it (lower case, other characters as `-`, at most 40 characters), ending with `-`.
pub fn generate_name(kind: &str, target: &str) -> String {
    let mut cleaned: String = target
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    cleaned.truncate(40);
    let cleaned = cleaned.trim_matches('-');
    if cleaned.is_empty() {
        format!("{kind}-")
    } else {
        format!("{kind}-{cleaned}-")
    }
}

/// The Revocation to create.
pub fn revocation(
    namespace: &str,
    target: RevocationTarget,
    cause: &str,
    args: &RevocationArgs,
    prefix: String,
) -> Revocation {
    Revocation {
        api_version: format!("{}/{}", apis::types::GROUP, apis::types::VERSION),
        kind: "Revocation".into(),
        metadata: ObjectMeta {
            name: args.name.clone(),
            generate_name: args.name.is_none().then_some(prefix),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        spec: RevocationSpec {
            target,
            cause: cause.into(),
            message: args.message.clone(),
            expires_at: None,
        },
        status: None,
    }
}

/// Whether `session` is covered by the revocation `name` (first or later cover).
pub fn covered_by(session: &AccessSession, name: &str) -> bool {
    session.phase() == SessionPhase::Revoked
        && session
            .status
            .as_ref()
            .and_then(|s| s.revocation.as_ref())
            .is_some_and(|r| {
                r.revocation_name.as_deref() == Some(name)
                    || r.covered_by
                        .iter()
                        .any(|c| c.revocation_name.as_deref() == Some(name))
            })
}

/// The live MCPServer's uid.
async fn server_uid(ctx: &Context, name: &str) -> Result<String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ctx.namespace, &mcpserver_resource());
    let server = api.get(name).await?;
    server
        .metadata
        .uid
        .ok_or_else(|| CliError::other(format!("MCPServer {name} has no uid")))
}

pub async fn revoke(ctx: &Context, args: &RevokeArgs) -> Result<String> {
    args.check().map_err(CliError::other)?;
    let (target, prefix) = if let Some(session) = &args.session {
        (
            RevocationTarget {
                session: Some(session.clone()),
                ..RevocationTarget::default()
            },
            generate_name("session", session),
        )
    } else if let Some(server) = &args.server {
        let uid = match &args.server_uid {
            Some(uid) => uid.clone(),
            None => server_uid(ctx, server).await?,
        };
        (
            RevocationTarget {
                server: Some(ServerRef {
                    name: server.clone(),
                    uid,
                }),
                ..RevocationTarget::default()
            },
            generate_name("server", server),
        )
    } else if let Some(subject) = &args.subject {
        (
            RevocationTarget {
                subject: Some(subject.clone()),
                ..RevocationTarget::default()
            },
            generate_name("subject", subject),
        )
    } else {
        return Err(CliError::other(
            "one of SESSION, --server or --subject is required",
        ));
    };
    let wanted = revocation(
        &ctx.namespace,
        target,
        &args.cause,
        &args.revocation,
        prefix,
    );
    apply(ctx, wanted, &args.revocation).await
}

/// Asks on stderr, reads one line from stdin; only `y` or `yes` proceeds.
fn confirm(question: &str, input: &mut impl BufRead) -> bool {
    eprint!("{question} (y/n): ");
    let mut answer = String::new();
    if input.read_line(&mut answer).is_err() {
        return false;
    }
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

pub async fn retire(ctx: &Context, args: &RetireArgs) -> Result<String> {
    let uid = server_uid(ctx, &args.server).await?;
    if !args.yes {
        let question = format!(
            "You are about to retire MCPServer {}/{} (uid {uid}): every session of that uid is \
             revoked and no session can ever be issued for it again.\nDo you want to continue?",
            ctx.namespace, args.server
        );
        if !confirm(&question, &mut std::io::stdin().lock()) {
            eprintln!("retire cancelled: nothing was changed");
            return Ok(String::new());
        }
    }
    let target = RevocationTarget {
        server: Some(ServerRef {
            name: args.server.clone(),
            uid,
        }),
        ..RevocationTarget::default()
    };
    let wanted = revocation(
        &ctx.namespace,
        target,
        SERVER_RETIRED,
        &args.revocation,
        generate_name("retire", &args.server),
    );
    apply(ctx, wanted, &args.revocation).await
}

/// Creates `wanted`, waits until applied and reports what it covers.
async fn apply(ctx: &Context, wanted: Revocation, args: &RevocationArgs) -> Result<String> {
    let api: Api<Revocation> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let created = api.create(&PostParams::default(), &wanted).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let applied = wait_applied(&api, created, args.timeout).await?;
    if let Some(format) = args.output {
        let mut shown = applied;
        shown.api_version = wanted.api_version;
        shown.kind = wanted.kind;
        return render::object(&shown, format);
    }
    let status = applied.status.clone().unwrap_or_default();
    let covered = covered_sessions(ctx, &applied, &name).await?;
    let now = Timestamp::now();
    let mut out = format!("revocation.access.mcp-runtime.dev/{name} created\n");
    let when = status
        .completed_at
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    let scope = if status.cluster_wide {
        "every namespace".to_string()
    } else {
        format!("namespace {}", ctx.namespace)
    };
    out.push_str(&format!(
        "applied at {when} in {scope}: {} session(s) covered (cause {})\n",
        status.revoked_sessions, applied.spec.cause
    ));
    if applied.spec.cause == SERVER_RETIRED {
        if let Some(server) = &applied.spec.target.server {
            out.push_str(&format!(
                "server uid {} is fenced: no session can be issued for it again\n",
                server.uid
            ));
        }
    }
    if let Some(line) = delivery_line(&api, &applied, args.timeout.min(DELIVERY_WAIT)).await {
        out.push_str(&line);
    }
    if !covered.is_empty() {
        out.push_str(&session_table(&covered, now, true, false).render());
    }
    Ok(out)
}

/// How long `revoke` waits for every connected gateway watch to have the revocation.
const DELIVERY_WAIT: Duration = Duration::from_secs(3);
/// How long it waits for a first report before concluding no gateway is connected.
const UNREPORTED: Duration = Duration::from_millis(600);

/// What the revocation's receipts say once every counted gateway watch has it (or after
/// `wait`): `delivered to 3/3 gateway watches in 1.4ms`. None when it changed no session or
/// the receipts cannot be read.
async fn delivery_line(
    api: &Api<Revocation>,
    applied: &Revocation,
    wait: Duration,
) -> Option<String> {
    let name = applied.metadata.name.clone()?;
    let started = Instant::now();
    let mut current = applied.clone();
    loop {
        let delivery = current.status.as_ref()?.delivery.as_ref()?;
        let (delivered, took) = apis::kinds::delivery_cells(Some(delivery));
        if took != "<pending>" && !delivery.replicas.is_empty() {
            return Some(format!(
                "delivered to {delivered} gateway watches in {took}\n"
            ));
        }
        // A replica serving a watch of these servers reports within a few hundred ms.
        let unreported = delivery.replicas.is_empty() && started.elapsed() >= UNREPORTED;
        if unreported || started.elapsed() >= wait {
            return Some(if delivery.gateways == 0 {
                "delivered to no gateway watch: no gateway of the affected servers is connected\n"
                    .to_string()
            } else {
                format!(
                    "delivered to {delivered} gateway watches so far (`kubectl get revocation {name}` follows the rest)\n"
                )
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        current = api.get(&name).await.ok()?;
    }
}

/// Polls until the server reports the revocation applied (`status.completedAt`). MCP Access
/// applies it in the transaction that creates it, so the created object usually has it.
async fn wait_applied(
    api: &Api<Revocation>,
    mut current: Revocation,
    timeout: Duration,
) -> Result<Revocation> {
    let name = current.metadata.name.clone().unwrap_or_default();
    let deadline = Instant::now() + timeout;
    loop {
        if current
            .status
            .as_ref()
            .is_some_and(|s| s.completed_at.is_some())
        {
            return Ok(current);
        }
        if Instant::now() >= deadline {
            return Err(CliError::other(format!(
                "timed out after {timeout:?} waiting for revocation {name} to be applied"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        current = api.get(&name).await?;
    }
}

/// The sessions the revocation `name` covers now, in the namespaces it reaches and the
/// caller may list.
async fn covered_sessions(
    ctx: &Context,
    revocation: &Revocation,
    name: &str,
) -> Result<Vec<AccessSession>> {
    let cluster_wide = revocation.status.as_ref().is_some_and(|s| s.cluster_wide);
    let api: Api<AccessSession> = if cluster_wide {
        Api::all(ctx.client.clone())
    } else {
        Api::namespaced(ctx.client.clone(), &ctx.namespace)
    };
    let target = &revocation.spec.target;
    let mut fields = vec!["status.phase=Revoked".to_string()];
    if let Some(session) = &target.session {
        fields.push(format!("metadata.name={}", selector_value(session)?));
    }
    if let Some(server) = &target.server {
        fields.push(format!("spec.server.uid={}", selector_value(&server.uid)?));
    }
    if let Some(subject) = &target.subject {
        fields.push(format!("spec.subject.user={}", selector_value(subject)?));
    }
    let params = ListParams::default().fields(&fields.join(","));
    let mut sessions: Vec<AccessSession> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|s| covered_by(s, name))
        .collect();
    sessions.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Ok(sessions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::types::{AccessSessionStatus, CoveringRevocation, RevocationInfo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn generated_names_are_dns_prefixes() {
        assert_eq!(
            generate_name("subject", "Alice@Example.com"),
            "subject-alice-example-com-"
        );
        assert_eq!(generate_name("session", "s1"), "session-s1-");
        assert_eq!(generate_name("server", "@@@"), "server-");
        let long = generate_name("retire", &"x".repeat(100));
        assert_eq!(long.len(), "retire-".len() + 40 + 1);
    }

    fn args(name: Option<&str>) -> RevocationArgs {
        RevocationArgs {
            message: Some("left the company".into()),
            name: name.map(Into::into),
            timeout: Duration::from_secs(1),
            output: None,
        }
    }

    #[test]
    fn a_given_name_replaces_the_generated_one() {
        let target = RevocationTarget {
            subject: Some("alice".into()),
            ..RevocationTarget::default()
        };
        let named = revocation(
            "ns",
            target.clone(),
            "manual",
            &args(Some("r1")),
            "p-".into(),
        );
        assert_eq!(named.metadata.name.as_deref(), Some("r1"));
        assert_eq!(named.metadata.generate_name, None);
        let generated = revocation("ns", target, "compromised", &args(None), "p-".into());
        assert_eq!(generated.metadata.name, None);
        assert_eq!(generated.metadata.generate_name.as_deref(), Some("p-"));
        assert_eq!(generated.spec.cause, "compromised");
        assert_eq!(generated.spec.message.as_deref(), Some("left the company"));
        let json = serde_json::to_value(&generated).unwrap();
        assert_eq!(json["kind"], "Revocation");
        assert_eq!(
            json["spec"]["target"],
            serde_json::json!({"subject": "alice"})
        );
    }

    fn revoked_by(first: &str, others: &[&str]) -> AccessSession {
        AccessSession {
            status: Some(AccessSessionStatus {
                phase: SessionPhase::Revoked,
                revocation: Some(RevocationInfo {
                    revoked_at: Time(Timestamp::UNIX_EPOCH),
                    cause: "manual".into(),
                    revocation_name: Some(first.into()),
                    covered_by: std::iter::once(first)
                        .chain(others.iter().copied())
                        .map(|n| CoveringRevocation {
                            cause: "manual".into(),
                            revocation_name: Some(n.into()),
                        })
                        .collect(),
                }),
                ..AccessSessionStatus::default()
            }),
            ..AccessSession::default()
        }
    }

    #[test]
    fn covered_means_named_among_the_covering_revocations() {
        assert!(covered_by(&revoked_by("a", &[]), "a"));
        assert!(covered_by(&revoked_by("a", &["b"]), "b"));
        assert!(!covered_by(&revoked_by("a", &["b"]), "c"));
        assert!(!covered_by(&AccessSession::default(), "a"));
    }

    #[test]
    fn only_y_or_yes_confirms() {
        for (answer, yes) in [
            ("y\n", true),
            ("YES\n", true),
            ("n\n", false),
            ("\n", false),
            ("", false),
            ("yep\n", false),
        ] {
            assert_eq!(confirm("go?", &mut answer.as_bytes()), yes, "{answer:?}");
        }
    }
}
