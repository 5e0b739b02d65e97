-- The ordered Deliveries that hold up number p_seq on endpoint p_endpoint, defined once:
-- ordered, not skipped out of the line, unresolved (PENDING or PROCESSING), with a smaller
-- Sequence Number. The Claim statement, the parker's and the resolver's second looks, the
-- hand-off, the ordering gate and its gap skip all ask about this set (worker/src/claim.rs,
-- worker/src/ordering.rs); through this function they cannot disagree about what "ahead"
-- means. A plain SQL function of one SELECT, STABLE: Postgres inlines it into each caller
-- (the partial index deliveries_ordered_open_idx serves it there).
CREATE FUNCTION railhook_ordered_ahead(p_endpoint text, p_seq bigint)
RETURNS SETOF deliveries
LANGUAGE sql STABLE AS $$
    SELECT * FROM deliveries
    WHERE endpoint_id = p_endpoint AND ordered AND ordering_skipped_at IS NULL
      AND status IN ('PENDING', 'PROCESSING') AND sequence_number < p_seq
$$;
