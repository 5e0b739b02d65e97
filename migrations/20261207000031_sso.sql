-- Dashboard single sign-on (issue #57, docs/ACCESS.md).
--
-- A sign-in in progress: the OAuth `state` (only its SHA-256), the nonce the ID token must
-- carry and the PKCE verifier, for ten minutes and one use — the callback deletes the row it
-- reads, so a replayed state (or the nonce bound to it) finds nothing.
CREATE TABLE sso_logins (
    state_hash     bytea PRIMARY KEY,
    nonce          text        NOT NULL,
    pkce_verifier  text        NOT NULL,
    project_id     text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sso_logins_created_idx ON sso_logins (created_at);

-- A dashboard session is a key's (api_key_id) or a person's (subject, email, role mapped
-- from the identity provider's claims when they signed in).
ALTER TABLE dashboard_sessions ALTER COLUMN api_key_id DROP NOT NULL;
ALTER TABLE dashboard_sessions ADD COLUMN subject text;
ALTER TABLE dashboard_sessions ADD COLUMN email text;
ALTER TABLE dashboard_sessions ADD COLUMN role text;
ALTER TABLE dashboard_sessions ADD CONSTRAINT dashboard_sessions_who_check
    CHECK (api_key_id IS NOT NULL OR (subject IS NOT NULL AND role IS NOT NULL)) NOT VALID;
