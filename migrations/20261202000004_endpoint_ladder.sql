-- Per-endpoint retry ladder override: waits in seconds ("60,300,900") and the number of
-- Attempts. NULL means the direction's default ladder (common/src/retry.rs).
ALTER TABLE endpoints ADD COLUMN retry_delays text;
ALTER TABLE endpoints ADD COLUMN max_attempts integer CHECK (max_attempts BETWEEN 1 AND 50);
