-- The parked ordered Delivery that comes next after number p_seq on endpoint p_endpoint,
-- defined once: PENDING, parked, the lowest Sequence Number above p_seq. A resolving worker
-- hands it off to itself (worker/src/claim.rs, hand_off_next) and a draining worker announces
-- it through the Outbox (worker/src/ordering.rs, release_next); through this function the
-- two cannot pick different rows. A plain SQL function of one SELECT, STABLE, like
-- railhook_ordered_ahead: Postgres inlines it into each caller (deliveries_parked_idx
-- serves it there).
--
-- Expand only: a new function, nothing stored, no lock on a table.
CREATE FUNCTION railhook_parked_successor(p_endpoint text, p_seq bigint)
RETURNS SETOF deliveries
LANGUAGE sql STABLE AS $$
    SELECT * FROM deliveries
    WHERE endpoint_id = p_endpoint AND parked_at IS NOT NULL AND status = 'PENDING'
      AND sequence_number > p_seq
    ORDER BY sequence_number
    LIMIT 1
$$;
