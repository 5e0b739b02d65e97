-- no-transaction
-- An application's endpoints (migration 20261205000019), indexed without blocking writes.
-- One statement per file: Postgres runs the statements of one multi-statement query in an
-- implicit transaction, where CONCURRENTLY is refused.
CREATE INDEX CONCURRENTLY IF NOT EXISTS endpoints_application_idx ON endpoints (application_id)
    WHERE application_id IS NOT NULL;
