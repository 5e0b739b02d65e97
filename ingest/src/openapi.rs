//! The OpenAPI document served at `/openapi.json`, generated from the handlers' annotations.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::incoming::{self, routes as sources};
use crate::routes::{admin, deliveries, endpoints, events, failed, replays, subscriptions};

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

#[derive(OpenApi)]
#[openapi(
    info(title = "Railhook", description = "Webhook delivery: accept Events, deliver them signed to every subscribed endpoint."),
    paths(
        admin::create_organization, admin::create_project, admin::create_api_key,
        admin::revoke_api_key,
        endpoints::create, endpoints::list, endpoints::get, endpoints::update, endpoints::delete,
        endpoints::secret, endpoints::rotate_secret, endpoints::health, endpoints::disable,
        endpoints::enable,
        subscriptions::create, subscriptions::list, subscriptions::get, subscriptions::update,
        subscriptions::delete,
        events::create, events::create_batch, events::get, events::list,
        deliveries::list, deliveries::get, deliveries::attempts, deliveries::retry,
        failed::list, failed::retry,
        replays::create, replays::list, replays::get, replays::cancel,
        sources::create, sources::list, sources::get, sources::delete,
        sources::create_destination, sources::list_destinations, incoming::receive,
    ),
    modifiers(&BearerSchemes)
)]
struct ApiDoc;

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
