//! Dashboard single sign-on with any OpenID Connect provider (docs/ACCESS.md): the
//! authorization code flow with PKCE, the ID token verified by the `openidconnect` crate
//! (signature against the issuer's published keys, issuer, audience, nonce, expiry), and a
//! role taken from the claims by the operator's rules.
//!
//! Invariants, and where they are kept:
//! - **A sign-in is used once.** `/dashboard/sso` stores the state's hash, the nonce and
//!   the PKCE verifier (`sso_logins`, ten minutes); the callback deletes the row it reads, so
//!   a replayed callback, and the nonce bound to it, find nothing. The state is also bound to
//!   the browser that started it (a `__Host-` cookie compared in constant time), so a
//!   callback link sent to someone else signs nobody in.
//! - **Nothing is trusted before the ID token is verified**: the role comes from the verified
//!   claims only (`groups` is read from the same verified token).
//! - **A person no rule matches is refused**, with a page that says so; nothing is written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreIdToken, CoreIdTokenVerifier, CoreProviderMetadata,
};
use openidconnect::{
    AuthorizationCode, ClientId, ClientSecret, CsrfToken, IssuerUrl, Nonce, PkceCodeChallenge,
    PkceCodeVerifier, RedirectUrl, Scope, TokenResponse,
};
use railhook_common::config::{ConfigError, OidcRoleRule, Settings};
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::Mutex;

use crate::access::Role;

/// How long discovery's answer (endpoints and keys) is reused before it is asked again.
const METADATA_TTL: Duration = Duration::from_secs(300);

/// The configured client.
pub struct Sso {
    issuer: IssuerUrl,
    client_id: ClientId,
    client_secret: SecretString,
    redirect: RedirectUrl,
    rules: Vec<OidcRoleRule>,
    http: Http,
    metadata: Mutex<Option<(Instant, CoreProviderMetadata)>>,
    /// Whether people may still sign in with an API key.
    pub key_sign_in: bool,
}

/// Why a sign-in was refused; shown to the person (never a token or a secret).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "This sign-in link was already used, has expired, or was started in another browser. Start again."
    )]
    Replayed,
    #[error(
        "The identity provider could not be reached or answered in a way Railhook cannot use ({0}). Try again, or tell your operator."
    )]
    Provider(&'static str),
    #[error("The identity provider's answer could not be verified ({0}). Start again.")]
    Unverified(String),
    #[error(
        "You signed in as {0}, but no rule gives you a role in any project. Ask your operator for access."
    )]
    Unmapped(String),
}

/// Who signed in, and where they may work.
pub struct Person {
    pub subject: String,
    pub email: Option<String>,
    pub grants: Vec<Grant>,
}

/// A role in a project or in every project of an organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Project { id: String, role: Role },
    Organization { id: String, role: Role },
}

/// Where the browser goes to sign in, and what the callback must find.
pub struct Started {
    pub url: String,
    pub state: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HttpError(String);

/// The provider's HTTP client: the workspace's reqwest, no redirects, a timeout. (The
/// issuer is the operator's setting, not a tenant's, so the egress rules for tenants' URLs
/// do not apply to it.)
struct Http(reqwest::Client);

type HttpFuture<'c> = std::pin::Pin<
    Box<dyn Future<Output = Result<openidconnect::HttpResponse, HttpError>> + Send + 'c>,
>;

impl<'c> openidconnect::AsyncHttpClient<'c> for Http {
    type Error = HttpError;
    type Future = HttpFuture<'c>;

    fn call(&'c self, request: openidconnect::HttpRequest) -> Self::Future {
        Box::pin(send(&self.0, request))
    }
}

async fn send(
    http: &reqwest::Client,
    request: openidconnect::HttpRequest,
) -> Result<openidconnect::HttpResponse, HttpError> {
    let (parts, body) = request.into_parts();
    let response = http
        .request(parts.method, parts.uri.to_string())
        .headers(parts.headers)
        .body(body)
        .send()
        .await
        .map_err(|e| HttpError(e.to_string()))?;
    let mut out = openidconnect::http::Response::builder().status(response.status());
    for (name, value) in response.headers() {
        out = out.header(name, value);
    }
    let body = response
        .bytes()
        .await
        .map_err(|e| HttpError(e.to_string()))?;
    out.body(body.to_vec())
        .map_err(|e| HttpError(e.to_string()))
}

impl Sso {
    /// The client of `settings`, if single sign-on is configured (validated by the config).
    pub fn from_settings(settings: &Settings) -> Result<Option<Arc<Sso>>, ConfigError> {
        let (Some(issuer), Some(id), Some(secret), Some(redirect), Some(roles)) = (
            &settings.oidc_issuer_url,
            &settings.oidc_client_id,
            &settings.oidc_client_secret,
            &settings.oidc_redirect_url,
            &settings.oidc_roles,
        ) else {
            return Ok(None);
        };
        let bad = |field: &'static str, why: String| ConfigError::Invalid {
            field,
            problem: why,
        };
        let http = reqwest::Client::builder()
            // Following redirects would let the provider's answers point us anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| bad("oidc_issuer_url", e.to_string()))?;
        let http = Http(http);
        Ok(Some(Arc::new(Sso {
            issuer: IssuerUrl::new(issuer.clone())
                .map_err(|e| bad("oidc_issuer_url", e.to_string()))?,
            client_id: ClientId::new(id.clone()),
            client_secret: secret.clone(),
            redirect: RedirectUrl::new(redirect.clone())
                .map_err(|e| bad("oidc_redirect_url", e.to_string()))?,
            rules: roles.rules().map_err(|e| bad("oidc_roles", e))?,
            http,
            metadata: Mutex::new(None),
            key_sign_in: settings.dashboard_key_sign_in,
        })))
    }

    /// The issuer's metadata and keys, discovered at most every [`METADATA_TTL`].
    async fn metadata(&self) -> Result<CoreProviderMetadata, Refusal> {
        let mut cached = self.metadata.lock().await;
        if let Some((at, m)) = cached.as_ref()
            && at.elapsed() < METADATA_TTL
        {
            return Ok(m.clone());
        }
        let m = CoreProviderMetadata::discover_async(self.issuer.clone(), &self.http)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "sso: discovery failed");
                Refusal::Provider("discovery")
            })?;
        *cached = Some((Instant::now(), m.clone()));
        Ok(m)
    }

    fn client(
        &self,
        metadata: CoreProviderMetadata,
    ) -> openidconnect::core::CoreClient<
        openidconnect::EndpointSet,
        openidconnect::EndpointNotSet,
        openidconnect::EndpointNotSet,
        openidconnect::EndpointNotSet,
        openidconnect::EndpointMaybeSet,
        openidconnect::EndpointMaybeSet,
    > {
        CoreClient::from_provider_metadata(
            metadata,
            self.client_id.clone(),
            Some(ClientSecret::new(
                self.client_secret.expose_secret().to_owned(),
            )),
        )
        .set_redirect_uri(self.redirect.clone())
    }

    /// The provider's sign-in URL, with a fresh state, nonce and PKCE challenge.
    pub async fn start(&self) -> Result<Started, Refusal> {
        let client = self.client(self.metadata().await?);
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, state, nonce) = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("email".into()))
            .add_scope(Scope::new("profile".into()))
            .set_pkce_challenge(challenge)
            .url();
        Ok(Started {
            url: url.to_string(),
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
        })
    }

    /// Exchanges `code` (with the stored verifier), verifies the ID token against `nonce`,
    /// and maps its claims to grants.
    pub async fn finish(
        &self,
        code: &str,
        nonce: &str,
        pkce_verifier: &str,
    ) -> Result<Person, Refusal> {
        let client = self.client(self.metadata().await?);
        let token = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|_| Refusal::Provider("no token endpoint"))?
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_owned()))
            .request_async(&self.http)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "sso: the code exchange failed");
                Refusal::Unverified("the code exchange was refused".into())
            })?;
        let id_token = token
            .id_token()
            .ok_or_else(|| Refusal::Unverified("no ID token".into()))?;
        let person = verify(id_token, &client.id_token_verifier(), nonce)?;
        let grants = grants(&self.rules, person.email.as_deref(), &person.groups);
        if grants.is_empty() {
            return Err(Refusal::Unmapped(
                person
                    .email
                    .clone()
                    .unwrap_or_else(|| person.subject.clone()),
            ));
        }
        Ok(Person {
            subject: person.subject,
            email: person.email,
            grants,
        })
    }
}

/// What a verified ID token says about its person.
#[derive(Debug)]
pub struct Verified {
    pub subject: String,
    pub email: Option<String>,
    pub groups: Vec<String>,
}

/// Verifies `id_token` (signature, issuer, audience, expiry and `nonce`, by `verifier`)
/// and reads the person from it. `groups` is not a standard claim: it is read from the
/// payload of the token just verified.
pub fn verify(
    id_token: &CoreIdToken,
    verifier: &CoreIdTokenVerifier<'_>,
    nonce: &str,
) -> Result<Verified, Refusal> {
    let claims = id_token
        .claims(verifier, &Nonce::new(nonce.to_owned()))
        .map_err(|e| Refusal::Unverified(e.to_string()))?;
    let email = claims
        .email()
        .map(|e| e.as_str().to_owned())
        .filter(|_| claims.email_verified() != Some(false));
    let compact = id_token.to_string();
    let groups = compact
        .split('.')
        .nth(1)
        .and_then(|p| URL_SAFE_NO_PAD.decode(p).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("groups").cloned())
        .and_then(|g| serde_json::from_value::<Vec<String>>(g).ok())
        .unwrap_or_default();
    Ok(Verified {
        subject: claims.subject().as_str().to_owned(),
        email,
        groups,
    })
}

/// Every grant the rules give a person with `email` and `groups`.
pub fn grants(rules: &[OidcRoleRule], email: Option<&str>, groups: &[String]) -> Vec<Grant> {
    let domain = email
        .and_then(|e| e.rsplit_once('@'))
        .map(|(_, d)| d.to_ascii_lowercase());
    rules
        .iter()
        .filter(|r| {
            let by_domain = r
                .email_domain
                .as_ref()
                .is_none_or(|d| domain.as_deref() == Some(d.to_ascii_lowercase().as_str()));
            let by_group = r.group.as_ref().is_none_or(|g| groups.contains(g));
            by_domain && by_group
        })
        .filter_map(|r| {
            let role = Role::parse(&r.role)?;
            match (&r.project, &r.organization) {
                (Some(p), _) => Some(Grant::Project {
                    id: p.clone(),
                    role,
                }),
                (None, Some(o)) => Some(Grant::Organization {
                    id: o.clone(),
                    role,
                }),
                (None, None) => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(role: &str, project: &str, domain: Option<&str>, group: Option<&str>) -> OidcRoleRule {
        OidcRoleRule {
            role: role.into(),
            project: Some(project.into()),
            organization: None,
            email_domain: domain.map(Into::into),
            group: group.map(Into::into),
        }
    }

    #[test]
    fn rules_match_by_domain_and_group() {
        let rules = vec![
            rule("viewer", "proj_a", Some("Example.com"), None),
            rule("admin", "proj_a", Some("example.com"), Some("platform")),
            rule("operator", "proj_b", None, Some("oncall")),
        ];
        let g = grants(&rules, Some("ann@example.com"), &[]);
        assert_eq!(g.len(), 1);
        let g = grants(&rules, Some("ann@example.com"), &["platform".into()]);
        assert_eq!(g.len(), 2);
        let g = grants(&rules, Some("bob@other.org"), &["oncall".into()]);
        assert_eq!(
            g,
            vec![Grant::Project {
                id: "proj_b".into(),
                role: Role::Operator
            }]
        );
        assert!(grants(&rules, Some("eve@example.com.evil"), &[]).is_empty());
        assert!(grants(&rules, None, &[]).is_empty());
    }
}

/// The ID token checks, on tokens signed here with a throwaway key (`testdata/`): a token
/// for another audience, an expired one, one whose payload was changed after signing, and
/// one with another nonce are each refused; the right one is read with its groups. The
/// whole flow against a real provider is `tests/it/sso.rs`.
#[cfg(test)]
mod verification_tests {
    use super::*;
    use chrono::{Duration as Span, Utc};
    use openidconnect::core::{
        CoreIdTokenClaims, CoreJsonWebKeySet, CoreJwsSigningAlgorithm, CoreRsaPrivateSigningKey,
    };
    use openidconnect::{
        Audience, EmptyAdditionalClaims, EndUserEmail, JsonWebKeyId, PrivateSigningKey,
        StandardClaims, SubjectIdentifier,
    };

    const ISSUER: &str = "https://idp.example.test";
    const CLIENT: &str = "railhook";

    fn key() -> CoreRsaPrivateSigningKey {
        CoreRsaPrivateSigningKey::from_pem(
            include_str!("../testdata/oidc_test_key.pem"),
            Some(JsonWebKeyId::new("test".into())),
        )
        .expect("key")
    }

    fn token(audience: &str, expires_in: Span, nonce: &str) -> CoreIdToken {
        let now = Utc::now();
        let claims = CoreIdTokenClaims::new(
            IssuerUrl::new(ISSUER.into()).expect("issuer"),
            vec![Audience::new(audience.into())],
            now + expires_in,
            now - Span::seconds(5),
            StandardClaims::new(SubjectIdentifier::new("alice".into()))
                .set_email(Some(EndUserEmail::new("alice@example.com".into())))
                .set_email_verified(Some(true)),
            EmptyAdditionalClaims {},
        )
        .set_nonce(Some(Nonce::new(nonce.into())));
        CoreIdToken::new(
            claims,
            &key(),
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            None,
            None,
        )
        .expect("signed")
    }

    fn verifier() -> CoreIdTokenVerifier<'static> {
        CoreIdTokenVerifier::new_confidential_client(
            ClientId::new(CLIENT.into()),
            ClientSecret::new("secret".into()),
            IssuerUrl::new(ISSUER.into()).expect("issuer"),
            CoreJsonWebKeySet::new(vec![key().as_verification_key()]),
        )
    }

    #[test]
    fn only_a_token_for_us_unexpired_unchanged_and_with_our_nonce_is_accepted() {
        let good = token(CLIENT, Span::minutes(5), "n1");
        let person = verify(&good, &verifier(), "n1").expect("accepted");
        assert_eq!(person.subject, "alice");
        assert_eq!(person.email.as_deref(), Some("alice@example.com"));

        let other_audience = token("someone-else", Span::minutes(5), "n1");
        assert!(verify(&other_audience, &verifier(), "n1").is_err());
        let expired = token(CLIENT, Span::minutes(-5), "n1");
        assert!(verify(&expired, &verifier(), "n1").is_err());
        assert!(verify(&good, &verifier(), "another-nonce").is_err());

        // The payload changed after signing (another subject): the signature no longer holds.
        let compact = good.to_string();
        let parts: Vec<&str> = compact.split('.').collect();
        let mut payload: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("b64")).expect("json");
        payload["sub"] = "mallory".into();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(payload.to_string()),
            parts[2]
        );
        let tampered: CoreIdToken = forged.parse().expect("still a JWT");
        assert!(verify(&tampered, &verifier(), "n1").is_err());
    }
}
