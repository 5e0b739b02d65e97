//! Dashboard single sign-on settings (docs/ACCESS.md): the OpenID Connect client and the
//! rules that give a signed-in person a role in a project or in every project of an
//! organization.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Settings, invalid};

/// One rule: who (an email domain, a group of the `groups` claim, or both) gets which role
/// where (one project, or every project of one organization).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OidcRoleRule {
    /// `viewer`, `operator` or `admin` (a person is never a send-only caller).
    pub role: String,
    pub project: Option<String>,
    pub organization: Option<String>,
    /// Matches an email whose domain is exactly this (`example.com`), case-insensitively.
    pub email_domain: Option<String>,
    /// Matches when the ID token's `groups` claim holds this group.
    pub group: Option<String>,
}

/// The rules, as a JSON text (`RAILHOOK_OIDC_ROLES='[{…}]'`) or as a TOML array of tables.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OidcRoles {
    Rules(Vec<OidcRoleRule>),
    Text(String),
}

impl OidcRoles {
    pub fn rules(&self) -> Result<Vec<OidcRoleRule>, String> {
        let rules = match self {
            OidcRoles::Rules(r) => r.clone(),
            OidcRoles::Text(t) => serde_json::from_str(t).map_err(|e| e.to_string())?,
        };
        for r in &rules {
            if !["viewer", "operator", "admin"].contains(&r.role.as_str()) {
                return Err(format!("role {:?}: use viewer, operator or admin", r.role));
            }
            if r.project.is_some() == r.organization.is_some() {
                return Err("each rule names exactly one of project or organization".into());
            }
            if r.email_domain.is_none() && r.group.is_none() {
                return Err("each rule matches an email_domain, a group, or both".into());
            }
        }
        Ok(rules)
    }
}

impl Settings {
    /// Single sign-on is all or nothing: with an issuer, the client, its secret, the
    /// redirect URL and at least one rule; and key sign-in may be turned off only then.
    pub(super) fn validate_sso(&self) -> Result<(), ConfigError> {
        let Some(issuer) = &self.oidc_issuer_url else {
            if !self.dashboard_key_sign_in {
                return Err(invalid(
                    "dashboard_key_sign_in",
                    "can be false only with single sign-on configured (oidc_issuer_url)",
                ));
            }
            return Ok(());
        };
        let absolute = |raw: &str| {
            url::Url::parse(raw)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        };
        if !absolute(issuer) {
            return Err(invalid(
                "oidc_issuer_url",
                "must be an absolute http(s) URL",
            ));
        }
        if !self.oidc_redirect_url.as_deref().is_some_and(absolute) {
            return Err(invalid(
                "oidc_redirect_url",
                "must be set with oidc_issuer_url: this API's /dashboard/sso/callback as browsers reach it",
            ));
        }
        if self.oidc_client_id.is_none() || self.oidc_client_secret.is_none() {
            return Err(invalid(
                "oidc_client_id",
                "and oidc_client_secret must be set with oidc_issuer_url",
            ));
        }
        let rules = self
            .oidc_roles
            .as_ref()
            .ok_or_else(|| invalid("oidc_roles", "must be set with oidc_issuer_url"))?
            .rules()
            .map_err(|e| invalid("oidc_roles", e))?;
        if rules.is_empty() {
            return Err(invalid("oidc_roles", "needs at least one rule"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_read_from_json_text_and_checked() {
        let ok = OidcRoles::Text(
            r#"[{"role": "admin", "project": "proj_1", "email_domain": "example.com"}]"#.into(),
        );
        assert_eq!(ok.rules().expect("rules").len(), 1);
        for bad in [
            r#"[{"role": "sender", "project": "p", "group": "g"}]"#,
            r#"[{"role": "admin", "group": "g"}]"#,
            r#"[{"role": "admin", "project": "p", "organization": "o", "group": "g"}]"#,
            r#"[{"role": "admin", "project": "p"}]"#,
            r#"[{"role": "admin", "project": "p", "group": "g", "extra": 1}]"#,
        ] {
            assert!(OidcRoles::Text(bad.into()).rules().is_err(), "{bad}");
        }
    }
}
