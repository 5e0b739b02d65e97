//! The OpenAPI document served at `/openapi.json`: this module gives its title and the
//! finishing touches; the operations come from the routers that serve them (`routes`,
//! `utoipa_axum`), so a route cannot be served undocumented or documented unserved.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

struct BearerSchemes;

impl Modify for BearerSchemes {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        for name in ["admin_token", "api_key", "portal_token"] {
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
        for (path, item) in &mut api.paths.paths {
            // The Svix-compatible surface answers errors in the Svix SDKs' own JSON shape
            // (crate::svix), so its operations keep application/json.
            let svix = path.starts_with(crate::svix::PREFIX);
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
                    if let (true, false, RefOr::T(answer)) = (is_error, svix, answer)
                        && let Some(content) = answer.content.shift_remove("application/json")
                    {
                        answer.content.insert(PROBLEM_JSON.to_owned(), content);
                    }
                }
                if svix {
                    answers.entry("default".to_owned()).or_insert_with(|| {
                        RefOr::T(
                            ResponseBuilder::new()
                                .description(
                                    "An error: `{code, detail}`, or for a refused field 422 \
                                     with `detail` a list of `{loc, msg, type}`.",
                                )
                                .content("application/json", ContentBuilder::new().build())
                                .build(),
                        )
                    });
                    continue;
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

/// The document's frame; `crate::router` adds every operation from the routers.
#[derive(OpenApi)]
#[openapi(info(
    title = "Railhook",
    description = "Webhook delivery: accept Events, deliver them signed to every subscribed endpoint."
))]
pub struct ApiDoc;

/// The routers' document with the bearer schemes and every error answer as problem+json
/// (the modifiers run after the operations are in, which `#[openapi(modifiers)]` would not).
pub fn finish(mut document: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    BearerSchemes.modify(&mut document);
    ProblemAnswers.modify(&mut document);
    document
}

/// `GET /openapi.json`.
pub async fn serve(
    document: std::sync::Arc<utoipa::openapi::OpenApi>,
) -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json((*document).clone())
}
