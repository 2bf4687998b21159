//! AccessSession: issued under the rules of DESIGN §2; updates keep every authority field;
//! a deleted session's name is reserved forever.

use crate::resources::{ResourceInfo, ACCESS_SESSIONS};
use crate::rules::{self, admit_session_update, validate_metadata};
use crate::strategy::{
    merge_metadata, Context, Facts, ObjectKey, Plan, Read, Rejection, Stop, Strategy, Withdrawal,
    Write,
};
use crate::types::{AccessSession, AccessSessionStatus, Kind, SessionPhase};
use crate::validation::FieldError;

use super::{admit_issuance, check_session_name, issuance_reads};

fn key_of(session: &AccessSession) -> (String, String) {
    (
        session.metadata.namespace.clone().unwrap_or_default(),
        session.metadata.name.clone().unwrap_or_default(),
    )
}

impl Strategy for AccessSession {
    const INFO: ResourceInfo = ACCESS_SESSIONS;

    fn validate_create(&self) -> Vec<FieldError> {
        rules::validate_session_spec(&self.spec)
    }

    fn create_reads(&self, _ctx: &Context) -> Vec<Read> {
        let (ns, name) = key_of(self);
        issuance_reads(&ns, &name, &self.spec)
    }

    fn admit_create(mut session: Self, ctx: &Context, facts: &Facts) -> Result<Plan<Self>, Stop> {
        let (ns, name) = key_of(&session);
        check_session_name(facts, &ns, &name)?;
        let admission = admit_issuance(facts, &ns, &name, &session.spec, ctx)?;
        session.spec = admission.spec;
        session.status = Some(AccessSessionStatus {
            phase: SessionPhase::Active,
            ..Default::default()
        });
        session.set_type_meta();
        Ok(Plan {
            writes: vec![Write::put(&session, true)?],
            object: session,
            warnings: admission.warnings,
        })
    }

    fn admit_update(
        current: Self,
        requested: Self,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let admission = admit_session_update(&current.spec, &requested.spec)?;
        let mut updated = current.clone();
        updated.metadata = merge_metadata(&current.metadata, &requested.metadata);
        let errors = validate_metadata(&updated.metadata);
        if !errors.is_empty() {
            return Err(Rejection::Invalid(errors).into());
        }
        if admission.spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        updated.spec = admission.spec;
        let writes = if updated == current {
            Vec::new()
        } else {
            vec![Write::put(&updated, false)?]
        };
        Ok(Plan {
            object: updated,
            writes,
            warnings: admission.warnings,
        })
    }

    /// The session goes and its name is reserved: a session name is never reused.
    fn admit_delete(
        current: Self,
        _by: &Withdrawal,
        _ctx: &Context,
        _facts: &Facts,
    ) -> Result<Plan<Self>, Stop> {
        let key = ObjectKey::for_object(&current);
        let uid = current.metadata.uid.clone().unwrap_or_default();
        Ok(Plan {
            object: current,
            writes: vec![
                Write::Remove { key: key.clone() },
                Write::ReserveName { key, uid },
            ],
            warnings: Vec::new(),
        })
    }
}
