-- What the active relay last saw, for `railhook slot status` (a separate process) to print.
-- One row per Slot, written by the relay every status interval.
CREATE TABLE relay_status (
    slot                    text PRIMARY KEY,
    last_heartbeat_seen_at  timestamptz,
    confirmed_lsn           pg_lsn,
    updated_at              timestamptz NOT NULL DEFAULT now()
);
