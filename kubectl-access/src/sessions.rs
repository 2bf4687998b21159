//! `who-can`: the sessions that grant access to a server now, and the session rows every
//! command prints.

use std::collections::BTreeMap;

use apis::tool_policy::{Caller, PolicyIndex};
use apis::types::{AccessSession, SessionPhase, ToolPolicy};
use jiff::Timestamp;
use kube::api::{Api, ListParams};

use crate::cli::{ListOutput, ObjectOutput, WhoCanArgs};
use crate::client::Context;
use crate::error::{CliError, Result};
use crate::render::{self, or_none, Table};

/// Whether `session` lets its holder in at `now`: Active (not pending, revoked or expired),
/// no revocation recorded, and `expiresAt` still ahead (the server marks expiry within a
/// second; this does not wait for it).
pub fn grants_now(session: &AccessSession, now: Timestamp) -> bool {
    session.phase() == SessionPhase::Active
        && session
            .status
            .as_ref()
            .is_none_or(|status| status.revocation.is_none())
        && session.spec.expires_at.as_ref().is_some_and(|t| t.0 > now)
}

/// The columns of a session: `NAMESPACE` first when several namespaces are shown, the
/// server's uid, grant and age with `-o wide`.
pub fn session_table(
    sessions: &[AccessSession],
    now: Timestamp,
    with_namespace: bool,
    wide: bool,
) -> Table {
    let mut headers = Vec::new();
    if with_namespace {
        headers.push("NAMESPACE");
    }
    headers.extend(["NAME", "SUBJECT", "AGENT", "TEAMS", "EXPIRES", "EXPIRES IN"]);
    if wide {
        headers.extend(["SERVER", "SERVER UID", "GRANT", "TOOLS", "PHASE", "AGE"]);
    }
    let mut table = Table::new(&headers);
    for s in sessions {
        let mut row = Vec::new();
        if with_namespace {
            row.push(s.metadata.namespace.clone().unwrap_or_default());
        }
        let expires = s.spec.expires_at.as_ref().map(|t| t.0);
        row.extend([
            s.metadata.name.clone().unwrap_or_default(),
            or_none(
                s.spec
                    .subject
                    .as_ref()
                    .map(|x| x.user.clone())
                    .unwrap_or_default(),
            ),
            or_none(
                s.spec
                    .agent
                    .as_ref()
                    .map(|a| a.name.clone())
                    .unwrap_or_default(),
            ),
            or_none(s.spec.teams.join(",")),
            expires
                .map(|t| t.to_string())
                .unwrap_or_else(|| "<none>".into()),
            render::until(expires, now),
        ]);
        if wide {
            let created = s.metadata.creation_timestamp.as_ref().map(|t| t.0);
            row.extend([
                s.spec.server.name.clone(),
                s.spec.server.uid.clone(),
                or_none(
                    s.spec
                        .grant
                        .as_ref()
                        .map(|g| g.name.clone())
                        .unwrap_or_default(),
                ),
                match &s.spec.tools {
                    None => "*".to_string(),
                    Some(tools) => or_none(tools.join(",")),
                },
                s.phase().as_str().to_string(),
                created
                    .map(|c| render::human_duration(now.duration_since(c)))
                    .unwrap_or_else(|| "<unknown>".into()),
            ]);
        }
        table.push(row);
    }
    table
}

/// The server's ToolPolicies, compiled per namespace: with `--tool`, a session that an
/// enforcing policy keeps from a destructive tool does not grant it (argument rules depend on
/// each call and are not judged here). A caller who may not read tool policies is told, and
/// the answer is by grants alone.
async fn policies_of(ctx: &Context, args: &WhoCanArgs) -> Result<BTreeMap<String, PolicyIndex>> {
    let api: Api<ToolPolicy> = if args.all_namespaces {
        Api::all(ctx.client.clone())
    } else {
        Api::namespaced(ctx.client.clone(), &ctx.namespace)
    };
    let params = ListParams::default().fields(&format!("spec.server.name={}", args.server));
    let listed = match api.list(&params).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            eprintln!(
                "Warning: cannot read toolpolicies ({}); answering by the sessions' grants alone.",
                status.message
            );
            return Ok(BTreeMap::new());
        }
        Err(e) => return Err(e.into()),
    };
    let mut by_namespace: BTreeMap<String, Vec<ToolPolicy>> = BTreeMap::new();
    for policy in listed {
        let ns = policy.metadata.namespace.clone().unwrap_or_default();
        by_namespace.entry(ns).or_default().push(policy);
    }
    Ok(by_namespace
        .into_iter()
        .map(|(ns, policies)| (ns, PolicyIndex::new(&policies)))
        .collect())
}

/// Sessions listed from the API carry no apiVersion/kind; printed objects do, as kubectl's.
pub fn with_type_meta(mut s: AccessSession) -> AccessSession {
    s.api_version = format!("{}/{}", apis::types::GROUP, apis::types::VERSION);
    s.kind = "AccessSession".into();
    s
}

pub async fn who_can(ctx: &Context, args: &WhoCanArgs) -> Result<String> {
    let api: Api<AccessSession> = if args.all_namespaces {
        Api::all(ctx.client.clone())
    } else {
        Api::namespaced(ctx.client.clone(), &ctx.namespace)
    };
    // The server filters by name and phase; expiry and revocation are checked here.
    let params = ListParams::default().fields(&format!(
        "spec.server.name={},status.phase=Active",
        args.server
    ));
    let now = Timestamp::now();
    let policies = match &args.tool {
        Some(_) => policies_of(ctx, args).await?,
        None => BTreeMap::new(),
    };
    let mut granting: Vec<AccessSession> = api
        .list(&params)
        .await?
        .items
        .into_iter()
        .filter(|s| grants_now(s, now))
        .filter(|s| {
            args.tool
                .as_deref()
                .is_none_or(|tool| apis::rules::tool_granted(s.spec.tools.as_deref(), tool))
        })
        .filter(|s| {
            match (
                &args.tool,
                policies.get(s.metadata.namespace.as_deref().unwrap_or_default()),
            ) {
                (Some(tool), Some(index)) => index.listable(
                    tool,
                    &Caller {
                        teams: &s.spec.teams,
                        agent: s.spec.agent.as_ref().map(|a| a.name.as_str()),
                    },
                ),
                _ => true,
            }
        })
        .collect();
    granting.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    match args.output {
        Some(ListOutput::Json) | Some(ListOutput::Yaml) => {
            let format = if args.output == Some(ListOutput::Json) {
                ObjectOutput::Json
            } else {
                ObjectOutput::Yaml
            };
            let items: Vec<AccessSession> = granting.into_iter().map(with_type_meta).collect();
            render::object(&render::list(&items), format)
        }
        _ if granting.is_empty() => {
            let scope = if args.all_namespaces {
                "any namespace".to_string()
            } else {
                format!("namespace {}", ctx.namespace)
            };
            let tool = args
                .tool
                .as_deref()
                .map(|t| format!(" tool {t}"))
                .unwrap_or_default();
            eprintln!(
                "No sessions grant access to {}{tool} in {scope}.",
                args.server
            );
            Ok(String::new())
        }
        output => Ok(session_table(
            &granting,
            now,
            args.all_namespaces,
            output == Some(ListOutput::Wide),
        )
        .render()),
    }
}

/// `Err` unless `value` is a usable field-selector value (the selector syntax has no quoting).
pub fn selector_value(value: &str) -> Result<&str> {
    if value.is_empty() || value.contains([',', '=', '!']) {
        return Err(CliError::other(format!(
            "{value:?} cannot be used in a field selector"
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::types::{
        AccessSessionSpec, AccessSessionStatus, AgentRef, RevocationInfo, ServerRef, Subject,
    };
    use jiff::SignedDuration;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn now() -> Timestamp {
        "2026-12-03T12:00:00Z".parse().unwrap()
    }

    fn mk_session(name: &str, phase: SessionPhase, expires_in_secs: i64) -> AccessSession {
        AccessSession {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team-a".into()),
                creation_timestamp: Some(Time(now() - SignedDuration::from_secs(600))),
                ..ObjectMeta::default()
            },
            spec: AccessSessionSpec {
                server: ServerRef {
                    name: "github".into(),
                    uid: "uid-1".into(),
                },
                agent: Some(AgentRef {
                    name: "billing-bot".into(),
                    uid: None,
                    calls_per_minute: None,
                }),
                subject: Some(Subject {
                    user: "alice@example.com".into(),
                }),
                teams: vec!["payments".into(), "ops".into()],
                expires_at: Some(Time(now() + SignedDuration::from_secs(expires_in_secs))),
                ..AccessSessionSpec::default()
            },
            status: Some(AccessSessionStatus {
                phase,
                ..AccessSessionStatus::default()
            }),
            ..AccessSession::default()
        }
    }

    #[test]
    fn only_active_unexpired_unrevoked_sessions_grant() {
        assert!(grants_now(
            &mk_session("a", SessionPhase::Active, 60),
            now()
        ));
        assert!(!grants_now(
            &mk_session("p", SessionPhase::PendingEnrollment, 60),
            now()
        ));
        assert!(!grants_now(
            &mk_session("r", SessionPhase::Revoked, 60),
            now()
        ));
        assert!(!grants_now(
            &mk_session("e", SessionPhase::Expired, 60),
            now()
        ));
        // Past expiresAt but not yet marked Expired by the server.
        assert!(!grants_now(
            &mk_session("late", SessionPhase::Active, -1),
            now()
        ));
        assert!(!grants_now(
            &mk_session("edge", SessionPhase::Active, 0),
            now()
        ));
        let mut revoked = mk_session("x", SessionPhase::Active, 60);
        revoked.status.as_mut().unwrap().revocation = Some(RevocationInfo {
            revoked_at: Time(now()),
            cause: "manual".into(),
            revocation_name: Some("r".into()),
            covered_by: vec![],
        });
        assert!(!grants_now(&revoked, now()));
        let mut no_expiry = mk_session("n", SessionPhase::Active, 60);
        no_expiry.spec.expires_at = None;
        assert!(!grants_now(&no_expiry, now()));
    }

    #[test]
    fn the_table_shows_who_and_until_when() {
        let mut team_only = mk_session("team-only", SessionPhase::Active, 3 * 3600);
        team_only.spec.subject = None;
        team_only.spec.agent = None;
        let table = session_table(
            &[mk_session("alice", SessionPhase::Active, 90), team_only],
            now(),
            false,
            false,
        );
        assert_eq!(
            table.render(),
            "NAME        SUBJECT             AGENT         TEAMS          EXPIRES                EXPIRES IN\n\
             alice       alice@example.com   billing-bot   payments,ops   2026-12-03T12:01:30Z   90s\n\
             team-only   <none>              <none>        payments,ops   2026-12-03T15:00:00Z   3h\n"
        );
    }

    #[test]
    fn wide_and_all_namespaces_add_columns() {
        let table = session_table(
            &[mk_session("a", SessionPhase::Active, 90)],
            now(),
            true,
            true,
        );
        assert_eq!(
            table.headers,
            [
                "NAMESPACE",
                "NAME",
                "SUBJECT",
                "AGENT",
                "TEAMS",
                "EXPIRES",
                "EXPIRES IN",
                "SERVER",
                "SERVER UID",
                "GRANT",
                "TOOLS",
                "PHASE",
                "AGE"
            ]
        );
        assert_eq!(table.rows[0][0], "team-a");
        assert_eq!(
            &table.rows[0][7..],
            ["github", "uid-1", "<none>", "*", "Active", "10m"]
        );
    }

    #[test]
    fn selector_values_cannot_smuggle_requirements() {
        assert!(selector_value("alice@example.com").is_ok());
        assert!(selector_value("a,status.phase=Revoked").is_err());
        assert!(selector_value("").is_err());
    }
}
