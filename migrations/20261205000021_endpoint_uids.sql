-- no-transaction
-- An endpoint's uid is unique within its scope (its application, or the project's own
-- endpoints), built without blocking writes. The API reads a violation of this index as
-- 409 (ingest/src/store/applications.rs, uid_taken).
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS endpoints_uid_idx
    ON endpoints (project_id, coalesce(application_id, ''), uid)
    WHERE deleted_at IS NULL AND uid IS NOT NULL;
