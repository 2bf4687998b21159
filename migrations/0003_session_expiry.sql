-- Session expiry (DESIGN §6): the apiserver turns a session Expired at spec.expiresAt. The
-- sweep asks for the due sessions and the scheduler for the earliest expiry, both over the
-- sessions that can still expire; this partial index on the expiry instant serves both
-- (RFC 3339 times of second precision compare as strings). Its predicate must stay exactly
-- the one in apiserver/src/store/pg/sessions.rs (CAN_EXPIRE) for the planner to use it.
CREATE INDEX objects_sessions_by_expiry ON objects ((body #>> '{spec,expiresAt}'))
    WHERE resource = 'accesssessions'
      AND COALESCE(body #>> '{status,phase}', 'Active') IN ('Active', 'PendingEnrollment');
