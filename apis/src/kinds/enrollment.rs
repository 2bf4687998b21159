//! Enrollment: creating one creates its AccessSession (same namespace, name and uid) in
//! `PendingEnrollment`; completing it through the status subresource activates the session;
//! withdrawing it while pending (its owner only) deletes the session and reserves its name.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::resources::{ResourceInfo, ENROLLMENTS};
use crate::rules::{self, check_completion, is_enrollment_owner};
use crate::strategy::{
    Context, Facts, ObjectKey, Plan, Read, Refusal, Rejection, Stop, Strategy, Withdrawal, Write,
};
use crate::table::{age, or_none, Column, TableRow, AGE, NAME};
use crate::types::{
    AccessSession, AccessSessionStatus, Agent, Enrollment, EnrollmentInfo, EnrollmentPhase,
    EnrollmentStatus, Kind, SessionPhase,
};
use crate::validation::{FieldError, FieldErrorKind};

use super::{admit_issuance, check_session_name, issuance_reads};

fn key_of(enrollment: &Enrollment) -> (String, String) {
    (
        enrollment.metadata.namespace.clone().unwrap_or_default(),
        enrollment.metadata.name.clone().unwrap_or_default(),
    )
}

/// The pending session an enrollment requested by `owner` at `requested_at` creates: same
/// namespace, name and uid.
pub fn pending_session(
    enrollment: &Enrollment,
    owner: &crate::strategy::Requester,
    requested_at: k8s_openapi::jiff::Timestamp,
) -> AccessSession {
    let requested_at = Time(requested_at);
    let mut session = AccessSession {
        metadata: ObjectMeta {
            name: enrollment.metadata.name.clone(),
            namespace: enrollment.metadata.namespace.clone(),
            uid: enrollment.metadata.uid.clone(),
            creation_timestamp: enrollment.metadata.creation_timestamp.clone(),
            generation: Some(1),
            labels: enrollment.metadata.labels.clone(),
            ..Default::default()
        },
        spec: enrollment.spec.clone(),
        status: Some(AccessSessionStatus {
            phase: SessionPhase::PendingEnrollment,
            enrollment: Some(EnrollmentInfo {
                state: "Pending".into(),
                owner: owner.name.clone(),
                owner_uid: (!owner.uid.is_empty()).then(|| owner.uid.clone()),
                requested_at,
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    session.set_type_meta();
    session
}

impl TableRow for Enrollment {
    const COLUMNS: &'static [Column] = &[
        NAME,
        Column::new(
            "Server",
            "string",
            "",
            "The MCPServer the session is for.",
            0,
        ),
        Column::new(
            "Agent",
            "string",
            "",
            "The agent acting under the session.",
            0,
        ),
        Column::new(
            "Owner",
            "string",
            "",
            "The user who requested the enrollment.",
            0,
        ),
        Column::new("Phase", "string", "", "Pending or Completed.", 0),
        AGE,
    ];

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let status = self.status.as_ref();
        vec![
            or_none(self.metadata.name.as_deref()),
            or_none(Some(&self.spec.server.name)),
            or_none(self.spec.agent.as_ref().map(|a| a.name.as_str())),
            or_none(status.and_then(|s| s.owner.as_deref())),
            Value::String(format!("{:?}", self.phase())),
            age(self.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
        ]
    }
}

impl Strategy for Enrollment {
    const INFO: ResourceInfo = ENROLLMENTS;

    fn validate_create(&self) -> Vec<FieldError> {
        rules::validate_session_spec(&self.spec)
    }

    fn create_reads(&self, _ctx: &Context) -> Vec<Read> {
        let (ns, name) = key_of(self);
        issuance_reads(&ns, &name, &self.spec)
    }

    fn admit_create(
        mut enrollment: Self,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&enrollment);
        check_session_name(facts, &ns, &name)?;
        if facts.object::<Enrollment>(&ns, &name)?.is_some() {
            return Err(Rejection::AlreadyExists.into());
        }
        let admission = admit_issuance(facts, &ns, &name, &enrollment.spec, ctx)?;
        let owner = &ctx.requester;
        enrollment.spec = admission.spec;
        enrollment.status = Some(EnrollmentStatus {
            phase: EnrollmentPhase::Pending,
            owner: Some(owner.name.clone()),
            owner_uid: (!owner.uid.is_empty()).then(|| owner.uid.clone()),
            requested_at: Some(Time(ctx.now)),
            completed_at: None,
        });
        enrollment.set_type_meta();
        let session = pending_session(&enrollment, owner, ctx.now);
        Ok(Plan {
            writes: vec![Write::put(&session, true)?, Write::put(&enrollment, true)?],
            object: enrollment,
            warnings: admission.warnings,
        })
    }

    /// A pending enrollment is withdrawn by its owner only (by name and uid): its session is
    /// deleted and the name reserved. A completed one is a record and goes for anyone who
    /// may delete it. Teardown and retention skip the owner check; retention removes only
    /// completed records.
    fn admit_delete(
        current: Self,
        by: &Withdrawal,
        _ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&current);
        let pending = current.phase() == EnrollmentPhase::Pending;
        if pending {
            let status = current.status.clone().unwrap_or_default();
            let owner = status.owner.unwrap_or_default();
            match by {
                Withdrawal::ByCaller(caller)
                    if !is_enrollment_owner(
                        &owner,
                        status.owner_uid.as_deref(),
                        &caller.name,
                        &caller.uid,
                    ) =>
                {
                    return Err(Refusal::NotOwner(owner).into())
                }
                Withdrawal::Retention => return Ok(Plan::unchanged(current)),
                _ => {}
            }
        }
        let mut writes = Vec::new();
        if pending {
            if let Some(session) = facts.object::<AccessSession>(&ns, &name)? {
                if session.metadata.uid == current.metadata.uid {
                    let key = ObjectKey::for_object(&session);
                    writes.push(Write::Remove { key: key.clone() });
                    writes.push(Write::ReserveName {
                        key,
                        uid: session.metadata.uid.clone().unwrap_or_default(),
                    });
                }
            }
        }
        writes.push(Write::Remove {
            key: ObjectKey::for_object(&current),
        });
        Ok(Plan {
            object: current,
            writes,
            warnings: Vec::new(),
        })
    }

    /// Completion: the only change allowed is `status.phase` to `Completed`; the request's
    /// `metadata.uid` and `resourceVersion` must be the stored ones.
    fn check_status(current: &Value, requested: &Value) -> Result<(), Rejection> {
        let uid = |v: &Value| {
            v.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let (current_uid, requested_uid) = (uid(current), uid(requested));
        if requested_uid != current_uid {
            return Err(Rejection::UidPrecondition {
                given: requested_uid.unwrap_or_default(),
                actual: current_uid.unwrap_or_default(),
            });
        }
        let rv = |v: &Value| v.pointer("/metadata/resourceVersion").cloned();
        if rv(requested) != rv(current) {
            return Err(Rejection::Modified);
        }
        let phase = requested
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut errors = Vec::new();
        if phase != "Completed" {
            errors.push(FieldError::new(
                FieldErrorKind::NotSupported,
                "status.phase",
                format!("Unsupported value: {phase:?}: supported values: \"Completed\""),
            ));
        }
        let mut before = current.clone();
        let mut after = requested.clone();
        for v in [&mut before, &mut after] {
            if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
                status.remove("phase");
            }
            if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("managedFields");
            }
        }
        let mut changed = Vec::new();
        diff_paths(&before, &after, "", &mut changed);
        for path in changed {
            errors.push(FieldError::forbidden(
                path,
                "completion sets status.phase to Completed and changes nothing else",
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Rejection::Invalid(errors))
        }
    }

    /// Completes the enrollment: under the lock, the session must still be this
    /// enrollment's, live, unrevoked, on an unfenced server and with a usable agent.
    fn admit_status(
        mut enrollment: Self,
        _requested: &Value,
        ctx: &Context,
        facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        if enrollment.phase() == EnrollmentPhase::Completed {
            return Ok(Plan::unchanged(enrollment));
        }
        let (ns, name) = key_of(&enrollment);
        let refuse = |why: String| -> Stop {
            Refusal::Completion {
                enrollment: name.clone(),
                why,
            }
            .into()
        };
        let Some(mut session) = facts.object::<AccessSession>(&ns, &name)? else {
            return Err(refuse("its session was deleted".into()));
        };
        if session.metadata.uid != enrollment.metadata.uid {
            return Err(refuse("its session was replaced".into()));
        }
        check_completion(&session, ctx.now).map_err(refuse)?;
        if facts.fenced(&session.spec.server.uid, &ns)? {
            return Err(refuse(format!(
                "server uid {:?} was retired",
                session.spec.server.uid
            )));
        }
        let agent = match &session.spec.agent {
            Some(a) => facts.object::<Agent>("", &a.name)?,
            None => None,
        };
        rules::check_session_agent(&session, agent.as_ref()).map_err(refuse)?;
        // Only the pending metadata goes: authorization fields stay exactly as issued.
        if let Some(status) = session.status.as_mut() {
            status.enrollment = None;
            status.phase = SessionPhase::Active;
        }
        let status = enrollment
            .status
            .get_or_insert_with(EnrollmentStatus::default);
        status.phase = EnrollmentPhase::Completed;
        status.completed_at = Some(Time(ctx.now));
        Ok(Plan {
            writes: vec![
                Write::put(&session, false)?,
                Write::put(&enrollment, false)?,
            ],
            object: enrollment,
            warnings: Vec::new(),
        })
    }
}

/// Paths (`a.b.c`) where two JSON documents differ.
fn diff_paths(a: &Value, b: &Value, prefix: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => diff_paths(va, vb, &path, out),
                    _ => out.push(path),
                }
            }
        }
        (x, y) if x != y => out.push(prefix.to_string()),
        _ => {}
    }
}

/// Whether a completed enrollment is past `retention` at `now` and the server removes it.
/// Times have second precision, so a record completed in the current second is due under a
/// zero retention.
pub fn due_for_collection(
    enrollment: &Enrollment,
    now: k8s_openapi::jiff::Timestamp,
    retention: k8s_openapi::jiff::SignedDuration,
) -> bool {
    let Some(status) = &enrollment.status else {
        return false;
    };
    let Some(completed) = &status.completed_at else {
        return false;
    };
    let cutoff = now.checked_sub(retention).unwrap_or(now);
    let cutoff = k8s_openapi::jiff::Timestamp::from_second(cutoff.as_second()).unwrap_or(cutoff);
    status.phase == EnrollmentPhase::Completed && completed.0 <= cutoff
}
