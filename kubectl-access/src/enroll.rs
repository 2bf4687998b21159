//! `enroll complete` (the status subresource, phase Completed, with the enrollment's uid as
//! a precondition: DESIGN §2) and `enroll withdraw` (delete a pending enrollment, which
//! deletes its pending session).

use apis::types::{AccessSession, Enrollment, EnrollmentPhase};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;

use crate::client::Context;
use crate::error::{CliError, Result};

fn phase(e: &Enrollment) -> EnrollmentPhase {
    e.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// The completion patch: the phase, and the uid read, so a re-created namesake is not
/// completed by mistake.
pub fn completion_patch(uid: &str) -> serde_json::Value {
    json!({"metadata": {"uid": uid}, "status": {"phase": "Completed"}})
}

pub async fn complete(ctx: &Context, name: &str) -> Result<String> {
    let api: Api<Enrollment> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let current = api.get(name).await?;
    if phase(&current) == EnrollmentPhase::Completed {
        return Ok(format!(
            "enrollment.access.mcp-runtime.dev/{name} already completed\n"
        ));
    }
    let uid = current.metadata.uid.clone().unwrap_or_default();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(completion_patch(&uid)),
    )
    .await?;
    let session: Api<AccessSession> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let state = match session.get(name).await {
        Ok(s) => format!("session {name} is {}", s.phase().as_str()),
        Err(e) => format!("session {name} not readable: {}", CliError::from(e)),
    };
    Ok(format!(
        "enrollment.access.mcp-runtime.dev/{name} completed ({state})\n"
    ))
}

pub async fn withdraw(ctx: &Context, name: &str) -> Result<String> {
    let api: Api<Enrollment> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let current = api.get(name).await?;
    if phase(&current) == EnrollmentPhase::Completed {
        return Err(CliError::other(format!(
            "enrollment {name} is already completed: there is no pending session to withdraw \
             (revoke the session instead)"
        )));
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: current.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(name, &params).await?;
    Ok(format!(
        "enrollment.access.mcp-runtime.dev/{name} withdrawn (pending session {name} deleted)\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_completion_patch_carries_only_the_phase_and_the_uid() {
        assert_eq!(
            completion_patch("u-1"),
            json!({"metadata": {"uid": "u-1"}, "status": {"phase": "Completed"}})
        );
    }
}
