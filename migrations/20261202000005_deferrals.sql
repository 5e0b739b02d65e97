-- Deferrals and the Ordering Buffer.
-- How many times a Delivery was deferred (breaker open, concurrency or rate limit, ordering
-- gate). Never an Attempt: it spaces out the next deferral and shows in the API.
ALTER TABLE deliveries ADD COLUMN deferral_count integer NOT NULL DEFAULT 0;
-- Token-bucket burst per endpoint (NULL: one second's worth of rate_limit_per_second).
ALTER TABLE endpoints ADD COLUMN rate_limit_burst integer CHECK (rate_limit_burst > 0);
ALTER TABLE endpoints ADD COLUMN breaker_changed_at timestamptz;
-- Set when a Delivery left the ordering line: a successor's gap timeout passed while it was
-- stuck, or a person retried it by hand. It still delivers, just not in order.
ALTER TABLE deliveries ADD COLUMN ordering_skipped_at timestamptz;
-- The ordering gate's question: does this endpoint have an unresolved ordered Delivery
-- numbered below mine? And the release's: which parked one comes next?
CREATE INDEX deliveries_ordered_open_idx ON deliveries (endpoint_id, sequence_number)
    WHERE ordered AND ordering_skipped_at IS NULL AND status IN ('PENDING', 'PROCESSING');
CREATE INDEX deliveries_parked_idx ON deliveries (endpoint_id, sequence_number)
    WHERE parked_at IS NOT NULL AND status = 'PENDING';
