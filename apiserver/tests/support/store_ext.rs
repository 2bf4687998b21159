//! The writes tests make through the storage port, spelled per kind: each is the production
//! `Store` call the HTTP handlers make for that request, with a test caller.

use apis::strategy::{Context, Requester, Withdrawal};
use apis::{AccessSession, Agent, Enrollment, EnrollmentPhase, Revocation};
use apiserver::store::{self, Preconditions, Result, RevokerAuthority, Store, Written};
use async_trait::async_trait;

/// The caller tests write as, unless a test names one.
pub fn admin() -> Requester {
    Requester {
        name: "admin".into(),
        uid: String::new(),
    }
}

fn ctx(requester: Requester, authority: RevokerAuthority) -> Context {
    let mut ctx = Context::new(store::now(), requester);
    ctx.authority = authority;
    ctx
}

#[async_trait]
pub trait StoreExt: Store {
    async fn create_session(
        &self,
        s: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>> {
        self.create(s, &ctx(admin(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    async fn update_session(
        &self,
        s: AccessSession,
        dry_run: bool,
    ) -> Result<Written<AccessSession>> {
        self.update(s, &ctx(admin(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    async fn create_agent(&self, a: Agent, dry_run: bool) -> Result<Written<Agent>> {
        self.create(a, &ctx(admin(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    async fn update_agent(&self, a: Agent, dry_run: bool) -> Result<Written<Agent>> {
        self.update(a, &ctx(admin(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    async fn update_metadata<K: apis::strategy::Strategy>(
        &self,
        o: K,
        dry_run: bool,
    ) -> Result<Written<K>> {
        self.update(o, &ctx(admin(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    /// A delete by an administrator (`kubectl delete`).
    async fn remove<K: apis::strategy::Strategy>(
        &self,
        namespace: &str,
        name: &str,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<K> {
        self.delete(
            namespace,
            name,
            &Withdrawal::ByCaller(admin()),
            &ctx(admin(), RevokerAuthority::Namespace),
            preconditions,
            dry_run,
        )
        .await
    }
    async fn create_enrollment(
        &self,
        e: Enrollment,
        owner: &Requester,
        dry_run: bool,
    ) -> Result<Written<Enrollment>> {
        self.create(e, &ctx(owner.clone(), RevokerAuthority::Namespace), dry_run)
            .await
    }
    /// Completion as `kubectl patch enrollment --subresource=status` makes it: the stored
    /// object with `status.phase: Completed`, `uid` (when given) a precondition.
    async fn complete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        dry_run: bool,
    ) -> Result<Enrollment> {
        let mut requested: Enrollment = self.get(namespace, name).await?;
        requested.status.get_or_insert_with(Default::default).phase = EnrollmentPhase::Completed;
        let requested = serde_json::to_value(&requested)
            .map_err(|e| store::StoreError::Internal(e.to_string()))?;
        self.write_status::<Enrollment>(
            namespace,
            name,
            &requested,
            &ctx(admin(), RevokerAuthority::Namespace),
            &Preconditions {
                uid: uid.map(str::to_string),
                resource_version: None,
            },
            dry_run,
        )
        .await
    }
    /// `caller` None: the namespace is being torn down.
    async fn delete_enrollment(
        &self,
        namespace: &str,
        name: &str,
        caller: Option<&Requester>,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Enrollment> {
        let by = match caller {
            Some(c) => Withdrawal::ByCaller(c.clone()),
            None => Withdrawal::NamespaceTeardown,
        };
        let requester = caller.cloned().unwrap_or_default();
        self.delete(
            namespace,
            name,
            &by,
            &ctx(requester, RevokerAuthority::Namespace),
            preconditions,
            dry_run,
        )
        .await
    }
    async fn create_revocation(
        &self,
        r: Revocation,
        authority: RevokerAuthority,
        dry_run: bool,
    ) -> Result<Written<Revocation>> {
        self.create(r, &ctx(admin(), authority), dry_run).await
    }
    /// `restore` false: the namespace is being torn down.
    async fn delete_revocation(
        &self,
        namespace: &str,
        name: &str,
        restore: bool,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Revocation> {
        let by = if restore {
            Withdrawal::ByCaller(admin())
        } else {
            Withdrawal::NamespaceTeardown
        };
        self.delete(
            namespace,
            name,
            &by,
            &ctx(admin(), RevokerAuthority::Namespace),
            preconditions,
            dry_run,
        )
        .await
    }
    /// One round of the server's enrollment retention.
    async fn collect_completed_enrollments(&self, retention: std::time::Duration) -> Result<usize>
    where
        Self: Sized,
    {
        store::collect_completed_enrollments(self, retention, store::now()).await
    }
}

impl<S: Store> StoreExt for S {}

/// The Status code and reason the API answers a storage error with (the production
/// mapping of `http/error.rs`).
pub fn status_of(e: &store::StoreError) -> (u16, &'static str) {
    let api =
        apiserver::http::ApiError::from_store(e.clone(), &apis::resources::ACCESS_SESSIONS, "x");
    (api.code.as_u16(), api.reason)
}

/// Whether the API answers the error 409 Conflict (a precondition, a concurrent change or a
/// rule refusing the write).
pub fn is_conflict(e: &store::StoreError) -> bool {
    status_of(e) == (409, "Conflict")
}

/// The message of a 409 Conflict, if the error is one.
pub fn conflict_message(e: &store::StoreError) -> Option<String> {
    is_conflict(e).then(|| e.to_string())
}
