//! Filtered candidates: the Deliveries a payload filter decides, planned as three integers
//! each (the Event, the filter, the route) over tables of the distinct filters and routes,
//! as `railhook_ingest()` takes them (migration 20261206000027). The statement writes a
//! candidate only if its filter holds for its Event's payload, and answers with the
//! positions it wrote; the id of each is derived here and in SQL alike
//! ([`filtered_delivery_id`]), so a declined candidate costs no id, no text and no row.
//!
//! Why this shape: one row per planned Delivery, with its id, texts and joins, cost more
//! than the filters themselves once an Event had 100 filtered endpoints
//! (docs/BENCHMARKS.md, "Payload filters").

use std::collections::HashMap;

/// Base-32 digits of a ULID (Crockford's, lower case as our ids are).
const DIGITS: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Candidates per statement: 6 base-32 digits number each (`railhook_filtered_delivery_id`).
pub(crate) const MAX_CANDIDATES: usize = 1 << 30;

/// The id of the Delivery that the candidate at 1-based position `n` of its statement writes
/// for Event `event_id` (`evt_` and a ULID): `dlv_`, the first 20 characters of the Event's
/// ULID (its time and 50 random bits), and `n` in 6 base-32 digits. The SQL function
/// `railhook_filtered_delivery_id` computes the same; the Delivery shares its Event's day.
pub(crate) fn filtered_delivery_id(event_id: &str, n: usize) -> String {
    debug_assert!(n < MAX_CANDIDATES);
    let ulid = event_id.get(4..24).unwrap_or_default();
    let mut id = String::with_capacity(30);
    id.push_str("dlv_");
    id.push_str(ulid);
    for shift in [25, 20, 15, 10, 5, 0] {
        id.push(char::from(DIGITS[(n >> shift) & 31]));
    }
    id
}

/// Where a filtered Delivery goes if its filter holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Route {
    pub(crate) endpoint_id: String,
    pub(crate) subscription_id: String,
    pub(crate) ordered: bool,
}

/// The filtered candidates of a plan, as the statement's columns. Positions are 1-based, as
/// SQL's `WITH ORDINALITY` counts them.
#[derive(Default, Clone)]
pub(crate) struct Filtered {
    /// Each distinct filter once (jsonpath text): the statement parses each once.
    pub(crate) filters: Vec<String>,
    pub(crate) route_endpoints: Vec<String>,
    pub(crate) route_subscriptions: Vec<String>,
    pub(crate) route_ordered: Vec<bool>,
    /// Per candidate: its Event (position in the plan's Events), filter and route.
    pub(crate) events: Vec<i32>,
    pub(crate) filter_of: Vec<i32>,
    pub(crate) route_of: Vec<i32>,
    filter_index: HashMap<String, i32>,
    route_index: HashMap<Route, i32>,
}

impl Filtered {
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Adds a candidate for the Event at 1-based position `event`.
    pub(crate) fn push(&mut self, event: i32, filter: &str, route: Route) {
        let filter = self.filter(filter);
        let route = self.route(route);
        self.push_indexed(event, filter, route);
    }

    pub(crate) fn push_indexed(&mut self, event: i32, filter: i32, route: i32) {
        self.events.push(event);
        self.filter_of.push(filter);
        self.route_of.push(route);
    }

    pub(crate) fn filter(&mut self, filter: &str) -> i32 {
        if let Some(&at) = self.filter_index.get(filter) {
            return at;
        }
        self.filters.push(filter.to_owned());
        let at = self.filters.len() as i32;
        self.filter_index.insert(filter.to_owned(), at);
        at
    }

    pub(crate) fn route(&mut self, route: Route) -> i32 {
        if let Some(&at) = self.route_index.get(&route) {
            return at;
        }
        self.route_endpoints.push(route.endpoint_id.clone());
        self.route_subscriptions.push(route.subscription_id.clone());
        self.route_ordered.push(route.ordered);
        let at = self.route_endpoints.len() as i32;
        self.route_index.insert(route, at);
        at
    }

    /// The filter text of candidate `at` (0-based).
    pub(crate) fn filter_text(&self, at: usize) -> &str {
        &self.filters[self.filter_of[at] as usize - 1]
    }

    /// The route of candidate `at` (0-based).
    pub(crate) fn route_of_candidate(&self, at: usize) -> (&str, &str, bool) {
        let r = self.route_of[at] as usize - 1;
        (
            &self.route_endpoints[r],
            &self.route_subscriptions[r],
            self.route_ordered[r],
        )
    }

    /// Appends `other`'s candidates, whose Events follow this plan's first `events` ones; a
    /// filter or route both share is kept once.
    pub(crate) fn append(&mut self, other: &Filtered, events: i32) {
        let filters: Vec<i32> = other.filters.iter().map(|f| self.filter(f)).collect();
        let routes: Vec<i32> = (0..other.route_endpoints.len())
            .map(|r| {
                self.route(Route {
                    endpoint_id: other.route_endpoints[r].clone(),
                    subscription_id: other.route_subscriptions[r].clone(),
                    ordered: other.route_ordered[r],
                })
            })
            .collect();
        for c in 0..other.len() {
            self.push_indexed(
                other.events[c] + events,
                filters[other.filter_of[c] as usize - 1],
                routes[other.route_of[c] as usize - 1],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_delivery_ids_of_the_events_time() {
        let event = railhook_common::ids::EventId::generate();
        let first = filtered_delivery_id(event.as_str(), 1);
        let last = filtered_delivery_id(event.as_str(), MAX_CANDIDATES - 1);
        for id in [&first, &last] {
            railhook_common::ids::DeliveryId::parse(id).expect("a delivery id");
            assert_eq!(id[4..14], event.as_str()[4..14], "the Event's time");
        }
        assert!(first.ends_with("000001"));
        assert!(last.ends_with("zzzzzz"));
        assert_ne!(first, filtered_delivery_id(event.as_str(), 2));
    }

    #[test]
    fn appending_keeps_each_filter_and_route_once() {
        let route = |e: &str| Route {
            endpoint_id: e.to_owned(),
            subscription_id: format!("sub_{e}"),
            ordered: false,
        };
        let mut a = Filtered::default();
        a.push(1, "$.x > 1", route("a"));
        a.push(1, "$.y > 1", route("b"));
        let mut b = Filtered::default();
        b.push(1, "$.y > 1", route("b"));
        b.push(2, "$.z > 1", route("c"));
        a.append(&b, 1);
        assert_eq!(a.filters, ["$.x > 1", "$.y > 1", "$.z > 1"]);
        assert_eq!(a.route_endpoints, ["a", "b", "c"]);
        assert_eq!(a.events, [1, 1, 2, 3]);
        assert_eq!(a.filter_of, [1, 2, 2, 3]);
        assert_eq!(a.route_of, [1, 2, 2, 3]);
        assert_eq!(a.filter_text(3), "$.z > 1");
        assert_eq!(a.route_of_candidate(2), ("b", "sub_b", false));
    }
}
