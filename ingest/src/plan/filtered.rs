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
use std::sync::Arc;

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

/// Distinct filters and routes, each numbered from 1 in its order.
#[derive(Default, Clone, Debug)]
pub(crate) struct Tables {
    pub(crate) filters: Vec<String>,
    pub(crate) route_endpoints: Vec<String>,
    pub(crate) route_subscriptions: Vec<String>,
    pub(crate) route_ordered: Vec<bool>,
    filter_index: HashMap<String, i32>,
    route_index: HashMap<Route, i32>,
}

impl Tables {
    /// The number of `filter`, added if new.
    pub(crate) fn filter(&mut self, filter: &str) -> i32 {
        if let Some(&at) = self.filter_index.get(filter) {
            return at;
        }
        self.filters.push(filter.to_owned());
        let at = self.filters.len() as i32;
        self.filter_index.insert(filter.to_owned(), at);
        at
    }

    /// The number of `route`, added if new.
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
}

/// The filtered candidates of a plan. A filter or route is numbered in the snapshot's own
/// [`Tables`] (shared by every request planned from that snapshot, built once:
/// `store::subscriptions::Subscriptions`) up to their length, and past it in this plan's
/// `extra` ones (filters joined for an endpoint two subscriptions match, or entries of
/// another snapshot met when plans are appended). So planning a candidate, and appending
/// the plans of requests of one snapshot, moves three integers and no text.
#[derive(Default, Clone)]
pub(crate) struct Filtered {
    base: Option<Arc<Tables>>,
    extra: Tables,
    /// Per candidate: its Event (1-based position in the plan's Events), filter and route.
    pub(crate) events: Vec<i32>,
    pub(crate) filter_of: Vec<i32>,
    pub(crate) route_of: Vec<i32>,
}

/// A statement's filtered columns: only the filters and routes its candidates use,
/// renumbered, as `railhook_ingest()` takes them.
pub(crate) struct Columns<'a> {
    pub(crate) filters: Vec<&'a str>,
    pub(crate) route_endpoints: Vec<&'a str>,
    pub(crate) route_subscriptions: Vec<&'a str>,
    pub(crate) route_ordered: Vec<bool>,
    pub(crate) filter_of: Vec<i32>,
    pub(crate) route_of: Vec<i32>,
}

impl Filtered {
    pub(crate) fn new(base: Arc<Tables>) -> Self {
        Self {
            base: Some(base),
            ..Self::default()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    fn base_len(&self) -> (i32, i32) {
        self.base.as_ref().map_or((0, 0), |b| {
            (b.filters.len() as i32, b.route_endpoints.len() as i32)
        })
    }

    /// Adds a candidate for the Event at 1-based position `event`, through filter and route
    /// numbers of the base tables.
    pub(crate) fn push_indexed(&mut self, event: i32, filter: i32, route: i32) {
        self.events.push(event);
        self.filter_of.push(filter);
        self.route_of.push(route);
    }

    /// Adds a candidate whose filter or route the base tables may not have.
    pub(crate) fn push(&mut self, event: i32, filter: &str, route: Route) {
        let (filters, routes) = self.base_len();
        let filter = filters + self.extra.filter(filter);
        let route = routes + self.extra.route(route);
        self.push_indexed(event, filter, route);
    }

    fn filter_text_of(&self, n: i32) -> &str {
        let (filters, _) = self.base_len();
        match &self.base {
            Some(base) if n <= filters => &base.filters[n as usize - 1],
            _ => &self.extra.filters[(n - filters) as usize - 1],
        }
    }

    fn route_by(&self, n: i32) -> (&str, &str, bool) {
        let (_, routes) = self.base_len();
        let (t, r) = match &self.base {
            Some(base) if n <= routes => (&**base, n as usize - 1),
            _ => (&self.extra, (n - routes) as usize - 1),
        };
        (
            &t.route_endpoints[r],
            &t.route_subscriptions[r],
            t.route_ordered[r],
        )
    }

    /// The filter text of candidate `at` (0-based).
    pub(crate) fn filter_text(&self, at: usize) -> &str {
        self.filter_text_of(self.filter_of[at])
    }

    /// The route of candidate `at` (0-based).
    pub(crate) fn route_of_candidate(&self, at: usize) -> (&str, &str, bool) {
        self.route_by(self.route_of[at])
    }

    /// Appends `other`'s candidates, whose Events follow this plan's first `events` ones.
    /// Of the same snapshot (the common case: requests of one second), its numbers hold
    /// as they are; otherwise its filters and routes are added by their text.
    pub(crate) fn append(&mut self, other: &Filtered, events: i32) {
        if self.len() == 0 && self.extra.filters.is_empty() && self.extra.route_endpoints.is_empty()
        {
            self.base.clone_from(&other.base);
        }
        let same = match (&self.base, &other.base) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let (filters, routes) = if same { other.base_len() } else { (0, 0) };
        for c in 0..other.len() {
            let (f, r) = (other.filter_of[c], other.route_of[c]);
            let filter = if f <= filters {
                f
            } else {
                let (mine, _) = self.base_len();
                mine + self.extra.filter(other.filter_text_of(f))
            };
            let route = if r <= routes {
                r
            } else {
                let (endpoint_id, subscription_id, ordered) = other.route_by(r);
                let (_, mine) = self.base_len();
                mine + self.extra.route(Route {
                    endpoint_id: endpoint_id.to_owned(),
                    subscription_id: subscription_id.to_owned(),
                    ordered,
                })
            };
            self.push_indexed(other.events[c] + events, filter, route);
        }
    }

    /// The statement's columns: the filters and routes the candidates use, each once.
    pub(crate) fn columns(&self) -> Columns<'_> {
        // Old number (1-based) → new number; 0: not used yet.
        let (base_filters, base_routes) = self.base_len();
        let mut filters = vec![0; base_filters as usize + self.extra.filters.len() + 1];
        let mut routes = vec![0; base_routes as usize + self.extra.route_endpoints.len() + 1];
        let mut out = Columns {
            filters: Vec::new(),
            route_endpoints: Vec::new(),
            route_subscriptions: Vec::new(),
            route_ordered: Vec::new(),
            filter_of: Vec::with_capacity(self.len()),
            route_of: Vec::with_capacity(self.len()),
        };
        for c in 0..self.len() {
            let (f, r) = (self.filter_of[c], self.route_of[c]);
            if filters[f as usize] == 0 {
                out.filters.push(self.filter_text_of(f));
                filters[f as usize] = out.filters.len() as i32;
            }
            if routes[r as usize] == 0 {
                let (endpoint, subscription, ordered) = self.route_by(r);
                out.route_endpoints.push(endpoint);
                out.route_subscriptions.push(subscription);
                out.route_ordered.push(ordered);
                routes[r as usize] = out.route_endpoints.len() as i32;
            }
            out.filter_of.push(filters[f as usize]);
            out.route_of.push(routes[r as usize]);
        }
        out
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

    fn route(e: &str) -> Route {
        Route {
            endpoint_id: e.to_owned(),
            subscription_id: format!("sub_{e}"),
            ordered: false,
        }
    }

    fn snapshot(filters: &[(&str, &str)]) -> Arc<Tables> {
        let mut t = Tables::default();
        for (f, e) in filters {
            t.filter(f);
            t.route(route(e));
        }
        Arc::new(t)
    }

    #[test]
    fn plans_of_one_snapshot_append_by_number_and_others_by_text() {
        let one = snapshot(&[("$.x > 1", "a"), ("$.y > 1", "b")]);
        let mut a = Filtered::new(one.clone());
        a.push_indexed(1, 1, 1);
        a.push(1, "($.x > 1) || ($.q > 1)", route("a"));
        let mut b = Filtered::new(one.clone());
        b.push_indexed(1, 2, 2);
        b.push(1, "($.x > 1) || ($.q > 1)", route("a"));
        // Another snapshot (the next second, or another key): same texts, other numbers.
        let other = snapshot(&[("$.z > 1", "c"), ("$.x > 1", "a")]);
        let mut c = Filtered::new(other);
        c.push_indexed(1, 1, 1);
        c.push_indexed(1, 2, 2);

        let mut all = Filtered::default();
        all.append(&a, 0);
        all.append(&b, 1);
        all.append(&c, 2);
        assert_eq!(all.events, [1, 1, 2, 2, 3, 3]);
        assert_eq!(all.filter_of, [1, 3, 2, 3, 4, 5]);
        let texts: Vec<&str> = (0..all.len()).map(|c| all.filter_text(c)).collect();
        assert_eq!(
            texts,
            [
                "$.x > 1",
                "($.x > 1) || ($.q > 1)",
                "$.y > 1",
                "($.x > 1) || ($.q > 1)",
                "$.z > 1",
                "$.x > 1"
            ]
        );
        assert_eq!(all.route_of_candidate(4), ("c", "sub_c", false));

        // The statement gets each text and route once, only those used, renumbered.
        let cols = all.columns();
        assert_eq!(
            cols.filters,
            [
                "$.x > 1",
                "($.x > 1) || ($.q > 1)",
                "$.y > 1",
                "$.z > 1",
                "$.x > 1"
            ]
        );
        assert_eq!(cols.filter_of, [1, 2, 3, 2, 4, 5]);
        // A route of the base met again in `extra` (joined filters, another snapshot) is
        // sent twice: harmless, and rare.
        assert_eq!(cols.route_endpoints, ["a", "a", "b", "c"]);
        assert_eq!(cols.route_of, [1, 2, 3, 2, 4, 2]);
    }
}
