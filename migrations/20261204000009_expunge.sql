-- Payload expunge (DELETE /v1/events/{id}/payload): the payload, the provider's raw body and
-- its forwarded headers are removed; the Event's metadata, its Deliveries and their Attempts
-- stay. `payload` keeps its NOT NULL: an expunged Event holds the JSON value null there.
ALTER TABLE events ADD COLUMN expunged_at timestamptz;
