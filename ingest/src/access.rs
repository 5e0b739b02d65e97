//! What a caller may do: the one table every project route and every dashboard action is
//! checked against (docs/ACCESS.md).
//!
//! The check runs where a caller is recognised — the `Project` and `Sender` extractors for
//! the API, the dashboard's `Session` extractor for its pages — so a handler cannot be
//! reached without it: there is no other way to obtain a `Project`. The route is the
//! router's template (`MatchedPath`), never the raw path, and a route the table does not
//! name as something lesser needs `admin`: a new mutating route is refused to every lesser
//! role until someone decides otherwise here.
//!
//! One rule lives in a handler because it depends on the body: an operator may open a
//! customer's portal only read-only (`routes::portal::issue`).

use axum::http::Method;

use crate::problem::ApiError;

/// A key's or a person's role in a project. Ordered for reading only; what each allows is
/// [`Role::allows`], not the order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Posts Events and nothing else — not even reads them back.
    Sender,
    /// Reads everything except secrets.
    Viewer,
    /// A viewer who can also retry, bulk retry, replay, disable and enable endpoints, and
    /// open a customer's portal read-only.
    Operator,
    /// Everything a project key could do before roles existed.
    Admin,
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Send,
    Read,
    Operate,
    Admin,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Sender, Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Sender => "sender",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn allows(self, need: Need) -> bool {
        match self {
            Role::Admin => true,
            Role::Operator => matches!(need, Need::Read | Need::Operate),
            Role::Viewer => need == Need::Read,
            Role::Sender => need == Need::Send,
        }
    }
}

/// Routes that post Events.
const SEND: &[&str] = &["/v1/events", "/v1/events/batch", "/api/v1/app/{app_id}/msg"];

/// Reads for admins only: those that show a secret (a signing secret, credentials, headers
/// that may carry one), the project's keys and the audit log.
const ADMIN_READS: &[&str] = &[
    "/v1/api-keys",
    "/v1/audit-log",
    "/dashboard/audit-log",
    "/v1/endpoints/{id}/secret",
    "/v1/operational-endpoints/{id}/secret",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/authentication",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/client-certificate",
    "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers",
    "/api/v1/operational-webhook/endpoint/{endpoint_id}/secret",
];

/// An operator's work: putting deliveries right, never changing configuration.
const OPERATE: &[(&str, &str)] = &[
    ("POST", "/v1/deliveries/{id}/retry"),
    ("POST", "/v1/failed-messages/retry"),
    ("POST", "/v1/replays"),
    ("POST", "/v1/replays/{id}/cancel"),
    ("POST", "/v1/endpoints/{id}/disable"),
    ("POST", "/v1/endpoints/{id}/enable"),
    ("POST", "/v1/applications/{id}/portal-access"),
    (
        "POST",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/recover",
    ),
    (
        "POST",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/replay-missing",
    ),
    (
        "POST",
        "/api/v1/app/{app_id}/endpoint/{endpoint_id}/send-example",
    ),
    (
        "POST",
        "/api/v1/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend",
    ),
    (
        "POST",
        "/api/v1/app/{app_id}/poller/{sink_id}/consumer/{consumer_id}/seek",
    ),
    ("POST", "/api/v1/auth/app-portal-access/{app_id}"),
    // A `railhook listen` session answers the project's Attempts.
    ("GET", "/v1/listen"),
    // The dashboard's forms: retry, bulk retry, replay, disable/enable, open a portal.
    ("POST", "/dashboard/deliveries/{id}/retry"),
    ("POST", "/dashboard/failed/retry"),
    ("POST", "/dashboard/replays"),
    ("POST", "/dashboard/endpoints/{id}/{action}"),
    ("POST", "/dashboard/applications/{id}/portal"),
];

/// What `method` on the route template `route` needs.
pub fn need(method: &Method, route: &str) -> Need {
    if *method == Method::POST && SEND.contains(&route) {
        return Need::Send;
    }
    if OPERATE
        .iter()
        .any(|(m, r)| method.as_str() == *m && *r == route)
    {
        return Need::Operate;
    }
    let read = *method == Method::GET || *method == Method::HEAD;
    if read && !ADMIN_READS.contains(&route) {
        return Need::Read;
    }
    Need::Admin
}

/// The application a route names in its path, if any: the one thing an application-scoped
/// key may touch. `/v1/applications/{id}/…` names it by id, Svix's `/api/v1/app/{app_id}/…`
/// by id or uid.
pub fn named_application<'a>(route: &str, params: &'a [(String, String)]) -> Option<&'a str> {
    let key = if route.starts_with("/v1/applications/{id}") {
        "id"
    } else if route.starts_with("/api/v1/app/{app_id}")
        || route.starts_with("/api/v1/auth/app-portal-access/{app_id}")
        || route.starts_with("/api/v1/auth/app/{app_id}")
    {
        "app_id"
    } else {
        return None;
    };
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Refuses `role` for `method` on `route`, with a detail that names the role and what the
/// route needs (no other caller's data).
pub fn check(role: Role, method: &Method, route: &str) -> Result<(), ApiError> {
    let need = need(method, route);
    if role.allows(need) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "this key's role `{}` does not allow {method} {route} (it needs {})",
            role.as_str(),
            match need {
                Need::Send => "the `sender` or `admin` role",
                Need::Read => "the `viewer`, `operator` or `admin` role",
                Need::Operate => "the `operator` or `admin` role",
                Need::Admin => "the `admin` role",
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_gets_what_the_table_says() {
        let post = Method::POST;
        let get = Method::GET;
        assert_eq!(need(&post, "/v1/events"), Need::Send);
        assert_eq!(need(&get, "/v1/events"), Need::Read);
        assert_eq!(need(&get, "/v1/endpoints/{id}/secret"), Need::Admin);
        assert_eq!(need(&post, "/v1/replays"), Need::Operate);
        assert_eq!(need(&post, "/v1/endpoints"), Need::Admin);
        assert_eq!(need(&Method::DELETE, "/v1/anything-new"), Need::Admin);
        assert!(Role::Sender.allows(Need::Send) && !Role::Sender.allows(Need::Read));
        assert!(Role::Viewer.allows(Need::Read) && !Role::Viewer.allows(Need::Operate));
        assert!(Role::Operator.allows(Need::Operate) && !Role::Operator.allows(Need::Admin));
        assert!(!Role::Operator.allows(Need::Send));
        for need in [Need::Send, Need::Read, Need::Operate, Need::Admin] {
            assert!(Role::Admin.allows(need));
        }
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
    }

    #[test]
    fn the_application_is_read_from_the_path_of_application_routes_only() {
        let params = vec![("app_id".to_owned(), "my-app".to_owned())];
        assert_eq!(
            named_application("/api/v1/app/{app_id}/msg", &params),
            Some("my-app")
        );
        let params = vec![("id".to_owned(), "app_1".to_owned())];
        assert_eq!(
            named_application("/v1/applications/{id}/portal-access", &params),
            Some("app_1")
        );
        assert_eq!(named_application("/v1/endpoints/{id}", &params), None);
    }
}
