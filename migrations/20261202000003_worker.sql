-- The worker's needs.
-- Attempt numbers are assigned per Delivery in order of recording; an Attempt made by a
-- worker that had lost its Claim (the Fence refused its outcome) is still recorded, because
-- the request did go out, and is marked `fenced`. Two such rows may share a number.
ALTER TABLE attempts DROP CONSTRAINT attempts_delivery_id_attempt_number_key;
ALTER TABLE attempts ADD COLUMN fenced boolean NOT NULL DEFAULT false;
CREATE INDEX attempts_delivery_idx ON attempts (delivery_id, attempt_number);
-- Where the retry ladder (and its hard cap) started: creation, or the last manual retry.
ALTER TABLE deliveries ADD COLUMN ladder_started_at timestamptz NOT NULL DEFAULT now();
-- The retry scheduler's and the sweeps' scans.
CREATE INDEX deliveries_processing_idx ON deliveries (last_attempt_at) WHERE status = 'PROCESSING';
CREATE INDEX deliveries_stranded_idx ON deliveries (updated_at) WHERE status = 'PENDING' AND next_retry_at IS NULL;
