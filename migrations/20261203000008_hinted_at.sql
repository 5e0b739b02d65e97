-- When the retry scheduler claimed a row and queued its RetryHint. While set, the row is
-- PROCESSING only because its hint waits in Kafka, not because a worker holds it; the
-- processing sweep gives such a row the stranded window instead of the processing timeout,
-- so Kafka lag longer than the processing timeout no longer makes the sweep and the
-- scheduler re-claim the same rows over and over (docs/RELIABILITY.md). The consumer's
-- token swap clears it.
ALTER TABLE deliveries ADD COLUMN hinted_at timestamptz;
