-- The customer portal (issue #38, docs/PORTAL.md): one-time access links, the sessions they
-- open, and each project's portal settings (who may frame it, how it looks).
--
-- Expand only: three new tables, nothing existing changes.

-- A link a team hands to one of its customers. Only the code's SHA-256 is kept (as for API
-- keys); the code works once: redeeming it is one conditional UPDATE on `redeemed_at`, so
-- two tabs racing on one link open one session.
CREATE TABLE portal_links (
    code_hash       bytea PRIMARY KEY,
    project_id      text        NOT NULL REFERENCES projects (id),
    application_id  text        NOT NULL REFERENCES applications (id),
    read_only       boolean     NOT NULL,
    -- How long the session the link opens lasts.
    session_seconds integer     NOT NULL CHECK (session_seconds > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    redeemed_at     timestamptz
);
CREATE INDEX portal_links_application_idx ON portal_links (application_id);
CREATE INDEX portal_links_expiry_idx ON portal_links (expires_at);

-- A customer's browser inside the portal. The token travels in the URL path (the portal is
-- framed cross-site, where cookies are unreliable: docs/PORTAL.md); only its SHA-256 is
-- kept. `id` names the session in logs, never the token.
CREATE TABLE portal_sessions (
    id             text PRIMARY KEY,
    token_hash     bytea       NOT NULL UNIQUE,
    -- The link that opened it: Svix's `logout` names the link's code.
    link_hash      bytea       NOT NULL,
    project_id     text        NOT NULL REFERENCES projects (id),
    application_id text        NOT NULL REFERENCES applications (id),
    read_only      boolean     NOT NULL,
    csrf_token     text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX portal_sessions_application_idx ON portal_sessions (application_id);
CREATE INDEX portal_sessions_link_idx ON portal_sessions (link_hash);
CREATE INDEX portal_sessions_expiry_idx ON portal_sessions (expires_at);

-- Per project: the origins that may frame the portal (CSP frame-ancestors; none: nobody)
-- and its theme. Colours are `#rrggbb` (checked by the API), so they are safe in CSS.
CREATE TABLE portal_settings (
    project_id       text PRIMARY KEY REFERENCES projects (id),
    allowed_origins  text[]      NOT NULL DEFAULT '{}',
    display_name     text,
    logo_url         text,
    primary_color    text,
    background_color text,
    -- `light`, `dark`, or `auto` (the customer's own preference).
    color_scheme     text        NOT NULL DEFAULT 'auto'
        CHECK (color_scheme IN ('light', 'dark', 'auto')),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
