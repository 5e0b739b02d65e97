//! The OpenAPI document served at `/openapi.json`, generated from the handlers' annotations.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::incoming::{self, routes as sources};
use crate::routes::{
    admin, deliveries, endpoint_secret, endpoint_state, endpoints, event_types, events, failed,
    operational_endpoints, replays, subscriptions,
};

struct BearerSchemes;

impl Modify for BearerSchemes {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        for name in ["admin_token", "api_key"] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

const PROBLEM_JSON: &str = "application/problem+json";

/// Every refusal is RFC 9457 `application/problem+json` (problem.rs), so the document says
/// so: the error answers a handler names are given that media type, and every operation gets
/// a `default` answer for the errors any route can give without naming them (400 for a
/// malformed body, 401 without a valid key, 413 over the payload limit, 415 for a body that
/// is not JSON, 429 past a quota or rate limit, 503 while the database is away).
struct ProblemAnswers;

impl Modify for ProblemAnswers {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        for item in api.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for op in operations.into_iter().flatten() {
                let answers = &mut op.responses.responses;
                for (status, answer) in answers.iter_mut() {
                    let is_error = status.starts_with('4') || status.starts_with('5');
                    if let (true, RefOr::T(answer)) = (is_error, answer)
                        && let Some(content) = answer.content.shift_remove("application/json")
                    {
                        answer.content.insert(PROBLEM_JSON.to_owned(), content);
                    }
                }
                answers.entry("default".to_owned()).or_insert_with(|| {
                    let problem = ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build();
                    RefOr::T(
                        ResponseBuilder::new()
                            .description("An error: RFC 9457 problem+json with a stable `code`.")
                            .content(PROBLEM_JSON, problem)
                            .build(),
                    )
                });
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Railhook", description = "Webhook delivery: accept Events, deliver them signed to every subscribed endpoint."),
    paths(
        admin::create_organization, admin::create_project, admin::create_api_key,
        admin::revoke_api_key,
        endpoints::create, endpoints::list, endpoints::get, endpoints::update, endpoints::delete,
        endpoint_secret::secret, endpoint_secret::rotate_secret, endpoint_state::health,
        endpoint_state::disable, endpoint_state::enable,
        subscriptions::create, subscriptions::list, subscriptions::get, subscriptions::update,
        subscriptions::delete,
        event_types::create, event_types::list, event_types::get, event_types::update,
        event_types::deprecate, event_types::delete,
        operational_endpoints::create, operational_endpoints::list, operational_endpoints::get, operational_endpoints::update,
        operational_endpoints::delete, operational_endpoints::secret, operational_endpoints::rotate_secret,
        events::create, events::create_batch, events::get, events::list, events::expunge,
        deliveries::list, deliveries::get, deliveries::attempts, deliveries::retry,
        failed::list, failed::retry,
        replays::create, replays::list, replays::get, replays::cancel,
        sources::create, sources::list, sources::get, sources::delete,
        sources::create_destination, sources::list_destinations, incoming::receive,
    ),
    modifiers(&BearerSchemes, &ProblemAnswers)
)]
struct ApiDoc;

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// `GET /openapi.json`. Served from here rather than from `routes`, which the document
/// lists: the routes never depend on their own description.
pub async fn serve() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(document())
}
