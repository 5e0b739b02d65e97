-- How an HTTP endpoint authenticates Railhook beyond the signature (common/src/endpoint_auth.rs):
-- shown without its secret, and whole, sealed with the keyring that seals signing secrets.
ALTER TABLE endpoints
    ADD COLUMN authentication jsonb,
    ADD COLUMN authentication_secret text;

ALTER TABLE endpoints
    ADD CONSTRAINT endpoints_authentication_pair
        CHECK ((authentication IS NULL) = (authentication_secret IS NULL)) NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_authentication_pair;
