-- Mutual TLS per endpoint (common/src/endpoint_auth.rs, ClientCertificate): the certificate
-- chain shown, and certificate and key together sealed with the keyring that seals signing
-- secrets (bound to '<endpoint id>/client_certificate').
ALTER TABLE endpoints
    ADD COLUMN client_certificate jsonb,
    ADD COLUMN client_certificate_secret text;

ALTER TABLE endpoints
    ADD CONSTRAINT endpoints_client_certificate_pair
        CHECK ((client_certificate IS NULL) = (client_certificate_secret IS NULL)) NOT VALID;
ALTER TABLE endpoints VALIDATE CONSTRAINT endpoints_client_certificate_pair;
