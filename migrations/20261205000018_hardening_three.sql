-- Review #34's schema changes. Expand only: a new table, new functions, a function
-- replaced with the same signature; nothing rewritten, no lock held on a busy table.

-- Hints whose Delivery row a worker could not see yet (item 1). A worker records the id
-- before it stores the hint's offset, then keeps looking for the row off the consumer's
-- path; a row still unclaimed when the record is older than the worker's look is handed to
-- the retry path by the sweep (worker/src/sweeps.rs, sweep_missed_hints), which runs every
-- sweep interval rather than the stranded sweep's hour. Small: one row per missed hint,
-- deleted by that sweep.
CREATE TABLE hint_misses (
    delivery_id text PRIMARY KEY,
    missed_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX hint_misses_missed_at_idx ON hint_misses (missed_at);

-- Time-range Replays never resend operational Events (item 12): those are Railhook's own
-- messages about endpoints, hidden from /v1/events, and a Replay is a sender's Events again.
CREATE OR REPLACE FUNCTION railhook_replay_selection(
    p_project text, p_event_ids text[], p_from timestamptz, p_to timestamptz, p_event_types text[])
RETURNS SETOF events
LANGUAGE sql STABLE AS $$
    SELECT * FROM events
    WHERE project_id = p_project AND NOT operational
      AND (p_event_ids IS NULL OR id = ANY (p_event_ids))
      AND (p_from IS NULL OR created_at >= p_from)
      AND (p_to IS NULL OR created_at < p_to)
      AND (p_event_types IS NULL OR event_type = ANY (p_event_types))
$$;

-- When a parked ordered Delivery (number p_seq on p_endpoint, first parked at p_parked_at)
-- next looks at its line by itself (item 3). Only a Delivery whose nearest unresolved
-- predecessor is stuck — tried and failed at least once, and not parked itself — keeps the
-- gap-timeout wake-up: it is the one the gap timeout exists for. Every other parked Delivery
-- is woken by what it waits on: that predecessor's resolution hands the line on
-- (railhook_parked_successor), and its first failed Attempt sets this wake-up for its
-- parked successor in the same transaction (worker/src/ordering.rs, "Wake-ups"). Until then
-- it waits p_fallback_secs, which only a lost wake-up would ever reach. So an outage costs
-- the same few hints a second however long the parked line is.
CREATE FUNCTION railhook_park_wakeup(
    p_endpoint text, p_seq bigint, p_parked_at timestamptz, p_gap_secs float8, p_fallback_secs float8)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN coalesce((SELECT a.parked_at IS NULL AND a.attempt_count > 0
                       FROM railhook_ordered_ahead(p_endpoint, p_seq) a
                       ORDER BY a.sequence_number DESC LIMIT 1), false)
            THEN greatest(coalesce(p_parked_at, now()) + make_interval(secs => p_gap_secs),
                          now() + interval '1 second')
        ELSE now() + make_interval(secs => p_fallback_secs)
    END
$$;
